"""The choice dialog (confirm a re-launch, replace a pending change, quit with one pending) and the help
screen listing every key."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from gpudash.tui.widgets.keybar import KEY_STYLE


@dataclass(frozen=True, slots=True)
class Choice:
    """One answer: the key that gives it (a Textual key name), how the key reads, and what it does."""

    key: str
    label: str
    value: str
    shown_key: str = ""

    @property
    def key_text(self) -> str:
        return self.shown_key or self.key


class ChoiceScreen(ModalScreen[str]):
    """Says what will happen and waits for one of its keys; the dialog returns that choice's value.
    Escape always answers (with the choice bound to it), so a dialog can never trap the operator."""

    def __init__(self, title: str, text: str, choices: list[Choice]) -> None:
        super().__init__(classes="confirm")
        self.title_text, self.text, self.choices = title, text, choices

    def compose(self) -> ComposeResult:
        with Vertical(classes="form"):
            yield Static(Text(self.title_text), classes="form-title", id="confirm-title")
            yield Static(Text(self.text), id="confirm-text")
            keys = Text()
            for c in self.choices:
                keys.append(f" {c.key_text} ", style=KEY_STYLE)
                keys.append(f" {c.label}   ")
            yield Static(keys, id="confirm-keys")

    def on_key(self, event: events.Key) -> None:
        for c in self.choices:
            if event.key == c.key:
                event.stop()
                self.dismiss(c.value)
                return


class HelpScreen(ModalScreen[None]):
    """Every key binding: its key (after remaps), its id (for [keys] in the config), what it does and
    on which tabs. The list scrolls by keyboard (up/down, j/k, PageUp/PageDown, Home/End) at any size."""

    AUTO_FOCUS = "DataTable"  # the app focuses nothing by itself; the list must take the scroll keys
    BINDINGS = [Binding("escape,question_mark,q,f1,h", "close", "Close", id="help.close"),
                Binding("j", "move(1)", "Down", show=False, id="help.down"),
                Binding("k", "move(-1)", "Up", show=False, id="help.up"),
                # the table's own Home/End scroll sideways; here they go to the first and the last key
                Binding("home", "move(-1000)", "First", show=False, priority=True, id="help.first"),
                Binding("end", "move(1000)", "Last", show=False, priority=True, id="help.last")]

    def __init__(self, rows: list[tuple[str, str, str, str]]) -> None:
        super().__init__(id="help")
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical(classes="form help"):
            yield Static(f"{len(self.rows)} keys (up/down, j/k, PgUp/PgDn, Home/End scroll; Esc closes). Remap "
                         "any of them in the config's \\[keys] by id, e.g. quit = \"ctrl+q\".", classes="form-title")
            table: DataTable[str] = DataTable(cursor_type="row", id="help-keys")
            table.add_columns("key", "id", "action", "where")
            table.add_rows(self.rows)
            yield table

    def action_move(self, step: int) -> None:
        table = self.query_one(DataTable)
        table.move_cursor(row=max(0, min(table.row_count - 1, table.cursor_row + step)))

    def action_close(self) -> None:
        self.dismiss(None)
