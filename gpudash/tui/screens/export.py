"""The export form: which format and which folder; an export never writes over files already there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, Static

from gpudash.runtime.history import EXPORT_FORMATS as FORMATS
from gpudash.runtime.history import missing_for
from gpudash.tui.screens.forms import FormInput, FormScreen, FuncValidator


@dataclass(frozen=True, slots=True)
class ExportRequest:
    session: int
    fmt: str
    folder: Path


def check_format(text: str) -> None:
    fmt = text.strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"format {text.strip()!r} is not one of {', '.join(FORMATS)}")
    problem = missing_for(fmt)
    if problem:
        raise ValueError(problem)


def formats_label() -> str:
    """The format field's label: the formats, and what one needs where this install lacks it."""
    needs = [f"{fmt} needs pyarrow, not installed here" for fmt in FORMATS if missing_for(fmt)]
    return f"format ({', '.join(FORMATS)}{'; ' + '; '.join(needs) if needs else ''})"


def check_folder(text: str) -> None:
    """A new or empty folder only: the export never overwrites."""
    if not text.strip():
        raise ValueError("give a folder to write the export into")
    folder = Path(text.strip()).expanduser()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} already exists and is not an empty folder; exports never overwrite, "
                         "so choose another folder")


class ExportForm(FormScreen):
    def __init__(self, session: int, folder: Path) -> None:
        super().__init__(id="export-form")
        self.session, self.folder = session, folder

    def compose(self) -> ComposeResult:
        with Vertical(classes="form"):
            yield Label(f"Export session {self.session}: one file per table. Enter: export, Esc: cancel",
                        classes="form-title")
            yield Label(formats_label())
            yield FormInput("csv", id="export-format", validators=[FuncValidator(check_format)],
                        validate_on=["changed", "submitted"])
            yield Label("folder (new or empty)")
            yield FormInput(str(self.folder), id="export-folder", validators=[FuncValidator(check_folder)],
                        validate_on=["changed", "submitted"])
            yield Static("", id="form-errors")

    def build(self) -> ExportRequest:
        return ExportRequest(self.session, self.query_one("#export-format", Input).value.strip().lower(),
                             Path(self.query_one("#export-folder", Input).value.strip()).expanduser())
