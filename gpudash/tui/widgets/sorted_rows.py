"""A table of rows that the operator sorts by a column and filters with `/`, and whose selection stays on its
row while rows come, go and move (nvitop keeps the selected process as its list re-sorts). The Processes and
Fleet tabs are such tables."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Row = TypeVar("Row")


@dataclass(frozen=True, slots=True)
class Sort(Generic[Row]):
    """One sort order: a column's name and its value for a row."""

    column: str
    value: Callable[[Row], Any]  # None: not known (such rows come last, either way)
    biggest_first: bool  # numbers biggest first, words from A, unless reversed


def filter_and_sort(rows: Iterable[Row], sort: Sort[Row], text: str, words: Callable[[Row], str],
                    tie: Callable[[Row], Any], reverse: bool = False) -> list[Row]:
    """The rows whose `words` (lower case) contain `text` (any case), in `sort`'s order (reversed with
    `reverse`), ties in `tie` order, rows with no value for the column last."""
    needle = text.strip().lower()
    kept = sorted((r for r in rows if not needle or needle in words(r)), key=tie)
    known = [r for r in kept if sort.value(r) is not None]
    known.sort(key=sort.value, reverse=sort.biggest_first != reverse)  # stable: ties keep `tie` order
    return known + [r for r in kept if sort.value(r) is None]


class KeepsSelection:
    """The selected row of those shown: `cursor` is its place, `_selected` its key (what stays selected)."""

    cursor = 0
    _selected: Hashable | None = None

    def follow_selection(self, keys: Sequence[Hashable]) -> None:
        """The rows shown are now `keys`: the cursor moves to the selected row, or stays in range."""
        if self._selected in keys:
            self.cursor = keys.index(self._selected)
        self.cursor = max(0, min(self.cursor, len(keys) - 1))
        self._selected = keys[self.cursor] if keys else None

    def step_selection(self, step: int, keys: Sequence[Hashable]) -> bool:
        """Up/down by `step` among `keys` (wrapping); False when no row is shown."""
        if not keys:
            return False
        self.cursor = (self.cursor + step) % len(keys)
        self._selected = keys[self.cursor]
        return True
