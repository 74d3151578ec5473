"""TextLines (the GPU cards' body): drawn as a Static draws the same text, and an update renders and
repaints only the lines that changed, nothing when none did."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import Static

from gpudash.tui.widgets.lines import Line, TextLines

pytestmark = pytest.mark.anyio

LINES = [Text.assemble(("GPU0 ", "bold"), "H200"), Text("util ░░░░ 3%"), Text("TX 0.00 GB/s", style="green"),
         Text("a line too long for the width, so it wraps"), Text("▁▁▁▁", style="cyan")]


class Pair(App[None]):
    CSS = "Static, TextLines { width: 24; height: 10; padding: 0 1; border: round $primary; }"

    def compose(self) -> ComposeResult:
        yield Static(Text("\n").join(LINES))
        yield TextLines()


def drawn(widget) -> list[list[tuple[str, object]]]:
    """Each row's segments: text and style (with the offsets that a mouse selection starts from)."""
    return [[(s.text, s.style) for s in strip] for strip in widget.render_lines(Region(0, 0, *widget.outer_size))]


async def test_drawn_as_a_static_draws_the_same_text() -> None:
    app = Pair()
    async with app.run_test(size=(40, 24)) as pilot:
        lines = app.query_one(TextLines)
        lines.show(LINES)
        await pilot.pause()
        assert "".join(s.text for s in lines.render_lines(Region(0, 0, *lines.outer_size))[5])  # it wrapped
        assert drawn(lines) == drawn(app.query_one(Static))
        assert str(lines.render()) == str(app.query_one(Static).render())  # what a mouse selection copies


async def test_only_changed_lines_are_rendered_and_repainted(monkeypatch) -> None:
    app = Pair()
    async with app.run_test(size=(40, 24)) as pilot:
        lines = app.query_one(TextLines)
        lines.show(LINES)
        await pilot.pause()
        rendered, repainted = [], []
        render_text = lines._render_text
        monkeypatch.setattr(lines, "_render_text", lambda line, y, width: rendered.append(line.plain) or
                            render_text(line, y, width))
        monkeypatch.setattr(lines, "refresh", lambda *regions: repainted.extend(regions))
        lines.show([line.copy() for line in LINES])  # equal lines: nothing to do
        assert rendered == [] and repainted == []
        lines.show([LINES[0], Text("util ░░░░ 4%"), *LINES[2:]])
        assert rendered == ["util ░░░░ 4%"] and repainted == [Region(0, 1, 20, 1)]
        repainted.clear()
        lines.show(LINES[:2])  # fewer lines: the rows below are cleared
        assert [r.y for r in repainted] == [1, 2, 3, 4, 5, 6]  # the long line took three rows


class Titled(App[None]):
    def compose(self) -> ComposeResult:
        yield Line("Processes: none on the GPUs")


async def test_a_line_updated_with_what_it_shows_asks_for_nothing(monkeypatch) -> None:
    """Static.update asks for a layout of the screen every time; a Line only when its content changed (the
    Overview's process title is set every tick)."""
    app = Titled()
    async with app.run_test(size=(40, 5)) as pilot:
        line = app.query_one(Line)
        await pilot.pause()
        asked: list[bool] = []
        monkeypatch.setattr(line, "refresh", lambda *regions, layout=False, **kw: asked.append(layout))
        line.update("Processes: none on the GPUs")
        line.update(Text("bold title", style="bold"))
        line.update(Text("bold title", style="bold"))  # equal: nothing
        line.update(Text("bold title", style="red"))  # the same characters in another style: drawn
        assert asked == [True, True]
