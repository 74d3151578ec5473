"""gpudash/outside.py: text from outside reaches a terminal as text."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from gpudash.outside import markup_free, printable


def test_control_characters_are_shown_as_their_escapes() -> None:
    hostile = "box\x1b]0;owned\x07\x1b[2J\r\nnext\x9b31m\u202eevil\x7f"
    shown = printable(hostile)
    assert shown == "box\\x1b]0;owned\\x07\\x1b[2J\\r\\nnext\\x9b31m\\u202eevil\\x7f"
    assert shown.isprintable()
    assert printable("plain text, ünïcode, 日本") == "plain text, ünïcode, 日本"


def test_markup_is_escaped_so_rich_prints_it_literally() -> None:
    label = "[link=file:///etc/shadow]click[/link] [/] [bold]x\x1b[31m"
    console = Console(width=200, record=True, color_system=None)
    console.print(markup_free(label))
    out = console.export_text().strip()
    assert out == "[link=file:///etc/shadow]click[/link] [/] [bold]x\\x1b[31m"
    assert Text.from_markup(markup_free(label)).spans == []
