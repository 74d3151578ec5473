"""The footer: the keys of the tab on screen (from the actions table), and Help and Quit pinned to the
right so that no terminal width hides them; keys that do not fit are left out from the end."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

KEY_STYLE = "bold black on dark_cyan"
Item = tuple[str, str]  # (key as shown, description)


def keys_text(items: list[Item], pinned: list[Item], width: int, note: Text | None = None) -> Text:
    """One line of `width` cells: as many items as fit, then `note` (e.g. the pending change, cut to
    the room left), then the pinned items flush right: those always show."""

    def chip(key: str, desc: str) -> Text:
        return Text.assemble((f" {key} ", KEY_STYLE), f" {desc} ")

    right = Text().join(chip(k, d) for k, d in pinned)
    room = max(0, width - right.cell_len)
    left = Text()
    for key, desc in items:
        c = chip(key, desc)
        if left.cell_len + c.cell_len > room:
            break
        left.append_text(c)
    if note is not None:
        left.append_text(note)
        left.truncate(room, overflow="ellipsis")
    left.append(" " * (room - left.cell_len))
    left.append_text(right)
    return left


class KeyBar(Static):
    """Docked at the bottom; the app hands it the keys of the active tab and any pending change."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.items: list[Item] = []
        self.pinned: list[Item] = []
        self.note: Text | None = None

    def show_keys(self, items: list[Item], pinned: list[Item], note: Text | None = None) -> None:
        if (items, pinned, note) != (self.items, self.pinned, self.note):
            self.items, self.pinned, self.note = items, pinned, note
            self.refresh()

    def render(self) -> Text:
        return keys_text(self.items, self.pinned, self.size.width or 80, self.note)
