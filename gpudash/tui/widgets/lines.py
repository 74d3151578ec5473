"""Text that costs nothing to show again: a block of lines that renders and repaints only the lines that
changed since the last update (TextLines), and a Static that an update with what it shows leaves alone (Line).

A Static re-renders all of its text on every update, and Textual repaints the whole widget. A GPU card
is mostly plots and labels that stay as they were from tick to tick while a few numbers move: on the
H200 box most of the UI thread went to rendering those unchanged lines again (StylesCache.render,
Content.render under the Overview's cards). And Static.update asks for a layout of the whole screen every
time, changed or not: one title updated each tick cost the Overview a full layout pass per tick.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.visual import Visual, VisualType, visualize
from textual.widget import Widget
from textual.widgets import Static


def _on_line(strip: Strip, y: int) -> Strip:
    """A strip rendered as line 0 of its text, its cells' selection offsets moved to line `y`."""
    return Strip([Segment(text, style + RichStyle.from_meta({"offset": (style.meta["offset"][0], y)}))
                  if style is not None and "offset" in style.meta else Segment(text, style, control)
                  for text, style, control in strip], strip.cell_length)


class TextLines(Widget):
    """Shows a list of rich Text lines, each rendered as a Static would render it (wrapped to the width)."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: list[Text] = []
        self._strips: list[list[Strip]] = []  # per line: its rendered rows (more than one where it wraps)
        self._rows: list[Strip] = []
        self._width = 0  # the width and the base style the strips were rendered with
        self._style: VisualStyle | None = None

    @property
    def lines(self) -> list[Text]:
        return self._lines

    def show(self, lines: list[Text]) -> None:
        """Render the lines that differ from those shown (a line's index counts), and repaint only the
        rows that came out different."""
        rows = self._rows
        self._lay_out(lines)
        dirty = [Region(0, y, self._width, 1) for y in range(max(len(rows), len(self._rows)))
                 if y >= len(rows) or y >= len(self._rows) or rows[y] != self._rows[y]]
        if dirty:
            self.refresh(*dirty)

    def _lay_out(self, lines: list[Text]) -> None:
        width, style = self.size.width, self.visual_style
        old = self._lines if (width, style) == (self._width, self._style) else []
        self._strips = [self._strips[i] if i < len(old) and old[i] == line else self._render_text(line, i, width)
                        for i, line in enumerate(lines)]
        self._lines, self._width, self._style = lines, width, style
        self._rows = [row for strips in self._strips for row in strips]

    def _render_text(self, line: Text, y: int, width: int) -> list[Strip]:
        """Line `y` as a Static shows it: its own style as a span (Textual maps a base style's colours
        apart from the theme's), and its cells marked as line `y` (where a mouse selection starts)."""
        line = Text().join([line]) if line.style else line
        strips = Visual.to_strips(self, visualize(self, line), width, None, self.visual_style)
        return [_on_line(strip, y) for strip in strips] if y else strips

    def render(self) -> Text:
        """The whole text: what a mouse selection is drawn over and copied from."""
        return Text("\n").join(self._lines)

    def render_line(self, y: int) -> Strip:
        if self.text_selection is not None:  # drawn over the whole text, as a Static draws it
            return super().render_line(y)
        if (self._width, self._style) != (self.size.width, self.visual_style):  # resized, or a new theme
            self._lay_out(self._lines)
        return self._rows[y] if y < len(self._rows) else Strip.blank(self.size.width, self.visual_style.rich_style)


class Line(Static):
    """A Static whose update with the content it already shows does nothing: no new visual, no repaint and
    no layout of the screen (Static.update does all three every time)."""

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        if not _same(content, self.content):
            super().update(content, layout=layout)


def _text_key(text: Text) -> tuple:
    return text.plain, text.spans, text.style, text.justify, text.overflow, text.no_wrap, text.end


def _same(a: object, b: object) -> bool:
    """Whether two contents show the same: equal strings, or Texts equal in characters, spans and style
    (Text's own == leaves its base style out). Anything else counts as new."""
    if isinstance(a, Text) and isinstance(b, Text):
        return _text_key(a) == _text_key(b)
    return type(a) is str and type(b) is str and a == b
