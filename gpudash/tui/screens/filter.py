"""The filter prompt of a table (`/`): Enter keeps the text, an empty text shows every row, Esc cancels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, Static

from gpudash.tui.screens.forms import FormScreen


class FilterForm(FormScreen):
    def __init__(self, what: str, text: str) -> None:
        super().__init__(id="filter-form")
        self.what, self.text = what, text

    def compose(self) -> ComposeResult:
        with Vertical(classes="form"):
            yield Label(f"Show only {self.what} containing (empty: all). Enter: filter, Esc: cancel",
                        classes="form-title")
            yield Input(self.text, id="filter-text")
            yield Static("", id="form-errors")

    def build(self) -> str:
        return self.query_one("#filter-text", Input).value
