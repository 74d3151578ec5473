"""The notice line: what gpudash tells the operator (applied, refused, saved, a GPU fault) on a line of its
own above the keys, where Textual's toasts were drawn over forms and text. The newest notice shows until
its time is up (then the one before it, if its time is not up either); the line takes no room when empty."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from gpudash.outside import printable

STYLE = {"information": "bold", "warning": "bold black on dark_orange", "error": "bold white on dark_red"}
MARK = {"information": "", "warning": "! ", "error": "✗ "}


@dataclass(frozen=True, slots=True)
class Notice:
    text: str
    severity: str
    until: float  # time.monotonic() when it goes


class NoticeLine(Static):
    """Docked above the key bar; `add` shows a notice as plain text through outside.printable: it may quote
    paths, "[engine]", or a server's refusal and error text (escapes shown, never obeyed; secrets masked)."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.notices: list[Notice] = []
        self.display = False

    def add(self, text: str, severity: str = "information", timeout: float = 5.0) -> None:
        self.notices.append(Notice(printable(" ".join(text.split())), severity, time.monotonic() + timeout))
        self.set_timer(timeout + 0.05, self._show)
        self._show()

    @property
    def shown(self) -> Notice | None:
        """The notice on screen: the newest whose time is not up."""
        now = time.monotonic()
        self.notices = [n for n in self.notices if n.until > now]
        return self.notices[-1] if self.notices else None

    def _show(self) -> None:
        notice = self.shown
        self.display = notice is not None
        if notice is not None:  # one at a time, no counter: the earlier ones are in Events
            self.update(Text(f" {MARK.get(notice.severity, '')}{notice.text} ", style=STYLE.get(notice.severity, "")))
