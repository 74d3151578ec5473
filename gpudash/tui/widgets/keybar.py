"""The footer: the keys of the tab on screen (from the actions table), and Help and Quit pinned to the
right so that no terminal width hides them; keys that do not fit are left out from the end."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

KEY_STYLE = "bold black on dark_cyan"
Item = tuple[str, str]  # (key as shown, description)


def keys_text(items: list[Item], pinned: list[Item], width: int, note: Text | None = None,
              more_key: str = "?") -> Text:
    """One line of `width` cells: as many items as fit, then `note` (e.g. the pending change, cut to
    the room left), then the pinned items flush right: those always show. When some items do not fit,
    the last ones give way to a "more: ?" hint (`more_key` opens the help, which lists every key)."""

    def chip(key: str, desc: str) -> Text:
        return Text.assemble((f" {key} ", KEY_STYLE), f" {desc} ")

    right = Text().join(chip(k, d) for k, d in pinned)
    room = max(0, width - right.cell_len)
    chips = [chip(k, d) for k, d in items]
    if sum(c.cell_len for c in chips) > room:  # keep room for the hint
        hint = Text.assemble((f" more: {more_key} ", "bold"), "")
        room_for_chips = room - hint.cell_len
    else:
        hint, room_for_chips = None, room
    left = Text()
    for c in chips:
        if left.cell_len + c.cell_len > room_for_chips:
            break
        left.append_text(c)
    if hint is not None and hint.cell_len <= room:
        left.append_text(hint)
    if note is not None:
        left.append_text(note)
        left.truncate(room, overflow="ellipsis")
    left.append(" " * (room - left.cell_len))
    left.append_text(right)
    return left


def note_fits(items: list[Item], pinned: list[Item], width: int, note: Text) -> bool:
    """Whether `note` fits on the keys' line whole."""
    used = sum(len(f" {k} ") + len(f" {d} ") for k, d in [*items, *pinned])
    return used + note.cell_len <= width


class KeyBar(Static):
    """Docked at the bottom; the app hands it the keys of the active tab and any pending change. A pending
    change too long for the keys' line gets a line of its own above them (the bar grows to two lines)."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.items: list[Item] = []
        self.pinned: list[Item] = []
        self.note: Text | None = None
        self.more_key = "?"

    def show_keys(self, items: list[Item], pinned: list[Item], note: Text | None = None, more_key: str = "?") -> None:
        if (items, pinned, note, more_key) != (self.items, self.pinned, self.note, self.more_key):
            self.items, self.pinned, self.note, self.more_key = items, pinned, note, more_key
            self._fit_height()
            self.refresh()

    def on_resize(self) -> None:
        self._fit_height()

    def _own_line(self) -> bool:
        return self.note is not None and not note_fits(self.items, self.pinned, self.size.width or 80, self.note)

    def _fit_height(self) -> None:
        self.styles.height = 2 if self._own_line() else 1

    def render(self) -> Text:
        width = self.size.width or 80
        if self._own_line():
            assert self.note is not None
            line = self.note.copy()
            line.truncate(width, overflow="ellipsis")
            return Text("\n").join([line, keys_text(self.items, self.pinned, width, None, self.more_key)])
        return keys_text(self.items, self.pinned, width, self.note, self.more_key)
