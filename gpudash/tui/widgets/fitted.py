"""A table that fits its screen by hiding columns in a declared order, then narrowing some; a sorted
column's header carries an arrow.

The views' tables take no focus (the arrow keys move the app's selection), so a column past the right
edge could never be scrolled to: at 80x24 the Servers table lost its last four columns that way. A
`FittedTable` measures its rows and hides the columns named in `drop`, in that order, until the rest
fits; if that is not enough, the columns of `squeeze` are narrowed (their cells cut with "…"), each to
no less than its minimum. `hidden` says which columns are hidden, for the line under the table. The
last column shown may be free text (a reason, a note): it counts at most LAST_COLUMN_CELLS, and the
edge cuts the rest of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable, Static

LAST_COLUMN_CELLS = 24
PADDING = 2  # DataTable's cell padding, one cell each side


def _cells(value: Any) -> int:
    return value.cell_len if isinstance(value, Text) else cell_len(str(value))


@dataclass(frozen=True)
class Fit:
    """Which columns show (indices), the cell width some of them are narrowed to, and whether the last
    one shown runs past the right edge."""

    shown: tuple[int, ...]
    narrowed: tuple[tuple[int, int], ...] = ()  # (column index, cells of content)
    last_cut: bool = False


def fit_columns(labels: Sequence[str], rows: Sequence[Sequence[Any]], drop: Sequence[str], width: int,
                squeeze: Mapping[str, int] | None = None, arrow: int | None = None) -> Fit:
    """The columns to show in `width` cells: all, less those of `drop` (in order) while too wide, then
    the columns of `squeeze` narrowed toward their minimum content width while still too wide. Column
    `arrow`'s header carries the sort arrow (a cell more)."""
    need = [max([_cells(label) + (i == arrow), *(_cells(r[i]) for r in rows)]) + PADDING
            for i, label in enumerate(labels)]
    shown = list(range(len(labels)))

    def wide() -> int:
        return sum(need[i] for i in shown[:-1]) + min(need[shown[-1]], LAST_COLUMN_CELLS)

    for label in drop:
        if wide() <= width:
            break
        shown.remove(labels.index(label))
    narrowed = []
    for label, least in (squeeze or {}).items():
        i = labels.index(label)
        excess = wide() - width
        if excess <= 0:
            break
        if i in shown and need[i] > least + PADDING:
            need[i] = max(least + PADDING, need[i] - excess)
            narrowed.append((i, need[i] - PADDING))
    return Fit(tuple(shown), tuple(narrowed), sum(need[i] for i in shown) > width)


def _plain(value: Any) -> Any:
    """A cell as it reads: DataTable takes a str as Rich markup, so text with brackets (a reason that names
    [engine], a command line) goes in as Text."""
    return Text(value) if isinstance(value, str) and "[" in value else value


def _cut(value: Any, cells: int) -> Any:
    """`value` in at most `cells` cells, ending in "…" where it was cut."""
    if _cells(value) <= cells:
        return value
    text = value.copy() if isinstance(value, Text) else Text(str(value))
    text.truncate(cells, overflow="ellipsis")
    return text


class FittedTable(DataTable[Any]):
    """A row-cursor DataTable without focus whose rows are set whole with `set_rows`; it posts
    `HiddenChanged` when a new width or new rows change the columns it hides."""

    class HiddenChanged(Message):
        def __init__(self, table: FittedTable) -> None:
            super().__init__()
            self.table = table

    def __init__(self, labels: Sequence[str], drop: Sequence[str] = (), squeeze: Mapping[str, int] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.can_focus = False
        unknown = (set(drop) | set(squeeze or {})) - set(labels)
        if unknown:
            raise ValueError(f"drop/squeeze name columns the table lacks: {sorted(unknown)}")
        self.labels, self.drop, self.squeeze = tuple(labels), tuple(drop), dict(squeeze or {})
        self._rows: list[tuple[Any, ...]] | None = None
        self._fit = Fit(tuple(range(len(self.labels))))
        self._sorted: tuple[str, bool] | None = None  # the column the rows are sorted by, and whether descending
        self._new_headers = False  # the arrow moved: the columns are added anew at the next refill
        self.add_columns(*self.labels)

    def _heading(self, i: int) -> str:
        """A column's header, with htop's arrow on the column the rows are sorted by (▼ biggest first)."""
        label = self.labels[i]
        if self._sorted is None or self._sorted[0] != label:
            return label
        return f"{label}{'▼' if self._sorted[1] else '▲'}"

    def sorted_by(self, label: str, descending: bool) -> None:
        """Mark `label` as the column the rows are sorted by (its header gets the arrow)."""
        if label not in self.labels:
            raise ValueError(f"no column {label!r} to sort by")
        if self._sorted != (label, descending):
            self._sorted, self._new_headers = (label, descending), True
            if self._rows is not None:
                self._refill(force=True)

    @property
    def cut(self) -> tuple[str, ...]:
        """Columns whose cells are cut short: narrowed ones (with "…"), and the last one at the edge."""
        cut = [self.labels[i] for i, _ in self._fit.narrowed]
        if self._fit.last_cut and self._fit.shown:
            cut.append(self.labels[self._fit.shown[-1]])
        return tuple(dict.fromkeys(cut))

    @property
    def hidden(self) -> tuple[str, ...]:
        return tuple(label for i, label in enumerate(self.labels) if i not in self._fit.shown)

    def set_rows(self, rows: Sequence[Sequence[Any]]) -> bool:
        """Show `rows` (full rows, every column); False when they were already shown."""
        rows = [tuple(r) for r in rows]
        if rows == self._rows:
            return False
        self._rows = rows
        self._refill(force=True)
        return True

    def on_resize(self) -> None:
        if self._rows is not None:
            self._refill(force=False)

    def _refill(self, force: bool) -> None:
        width = self.scrollable_content_region.width
        if width <= 0:  # a hidden tab's table: keep what it shows until it is on screen again
            if not force:
                return
            fit = self._fit
        else:
            arrow = self.labels.index(self._sorted[0]) if self._sorted is not None else None
            fit = fit_columns(self.labels, self._rows or [], self.drop, width, self.squeeze, arrow)
        if fit != self._fit or self._new_headers:  # columns only widen with their content: narrowed ones are made anew
            self.clear(columns=True)
            self.add_columns(*(self._heading(i) for i in fit.shown))
            self._new_headers = False
            if fit != self._fit:
                self._fit = fit
                self.post_message(self.HiddenChanged(self))
        elif not force:
            return
        else:
            self.clear()
        narrow = dict(fit.narrowed)
        self.add_rows([tuple(_cut(r[i], narrow[i]) if i in narrow else _plain(r[i]) for i in fit.shown)
                       for r in self._rows or []])


def hidden_columns_line() -> Static:
    """The line under a FittedTable that names what it hides (NamesHiddenColumns keeps it current)."""
    line = Static("", classes="hidden-columns")
    line.display = False
    return line


class NamesHiddenColumns:
    """Mixed into a view that holds one FittedTable and its hidden_columns_line: keeps the line current,
    naming the columns hidden and those cut short. `CUT_HINT` says where a view shows cut text whole."""

    CUT_HINT = "widen the terminal"

    def on_fitted_table_hidden_changed(self, message: FittedTable.HiddenChanged) -> None:
        message.stop()
        line = self.query_one(".hidden-columns", Static)  # type: ignore[attr-defined]
        hidden, cut = message.table.hidden, message.table.cut
        parts = ([f"not shown at this width: {', '.join(hidden)}"] if hidden else []) + \
                ([f"cut short: {', '.join(cut)}"] if cut else [])
        line.update(Text(f"{'; '.join(parts)} ({self.CUT_HINT})") if parts else "")
        line.display = bool(parts)
