"""Confirmation before a change that re-launches a server, and the help screen listing every key."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label


class ConfirmScreen(ModalScreen[bool]):
    """Says what will happen (e.g. a re-launch) and waits for y or n."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes, apply", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]

    def __init__(self, text: str) -> None:
        super().__init__(id="confirm")
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(classes="form"):
            yield Label(self.text, id="confirm-text")
            yield Label("y: apply   n / Esc: cancel", classes="form-title")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class HelpScreen(ModalScreen[None]):
    """Every key binding: its key (after remaps), its id (for [keys] in the config) and what it does."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close", id="help.close")]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__(id="help")
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical(classes="form help"):
            yield Label("Keys (remap any of them in the config's \\[keys] by id, e.g. quit = \"ctrl+q\"). "
                        "Esc closes.", classes="form-title")
            table: DataTable[str] = DataTable(cursor_type="row")
            table.add_columns("key", "id", "action")
            table.add_rows(self.rows)
            yield table

    def action_close(self) -> None:
        self.dismiss(None)
