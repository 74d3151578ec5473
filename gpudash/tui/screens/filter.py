"""The filter prompt of a table (`/`): Enter keeps the text, an empty text shows every row, Esc cancels."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, Static

from gpudash.tui.screens.forms import FormInput, FormScreen


class FilterForm(FormScreen):
    """`rows`: what the table lists ("processes"); `fields`: what the text is looked for in."""

    def __init__(self, rows: str, fields: str, text: str) -> None:
        super().__init__(id="filter-form")
        self.rows, self.fields, self.text = rows, fields, text

    def compose(self) -> ComposeResult:
        with Vertical(classes="form"):
            yield Label(Text(f"Show only the {self.rows} whose {self.fields} contains this text (any case; "
                             "empty: show all). Enter: filter, Esc: cancel"), classes="form-title")
            yield FormInput(self.text, id="filter-text")
            yield Static("", id="form-errors")

    def build(self) -> str:
        return self.query_one("#filter-text", Input).value
