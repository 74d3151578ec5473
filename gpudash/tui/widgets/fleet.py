"""Fleet: every box one Prometheus scrapes, as rows (sortable, `/` filter), read through gpudash/fleet
while the tab is on screen; Enter opens one box: its servers and the last hour of its GPUs, plotted.
A box is a host: its dcgm-exporter, its servers' own /metrics and its gpudash, whichever it runs.

The Prometheus is `[fleet] prometheus` or `gpudash launch --fleet URL`; without one the tab says how to
set it and nothing is sent anywhere. Each read is a worker thread with the client's bounds (one timeout,
a size cap), chained: the next starts `[fleet] refresh_s` after the last one ended, never two at once,
and none while the tab is off screen. A read that fails says why in full under the title ("cannot reach
Prometheus at ...: ...", as `gpudash fleet` does) and keeps the last rows, marked "stale since". Labels
from Prometheus are shown as text (gpudash/outside.py, through fleet/cells.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import Static
from textual_plotext import PlotextPlot

from gpudash import fmt
from gpudash.fleet.boxes import DOWN, NO_METRICS, PARTLY, STALE, Fleet, FleetBox
from gpudash.fleet.cells import COLUMNS, SERVER_COLUMNS, box_cells, server_cells
from gpudash.outside import printable
from gpudash.runtime.fleet import FleetReader, PrometheusError
from gpudash.tui import messages as msg
from gpudash.tui.state import ViewState
from gpudash.tui.widgets.fitted import FittedTable, fit_columns
from gpudash.tui.widgets.lines import TextLines
from gpudash.tui.widgets.sorted_rows import KeepsSelection, Sort, filter_and_sort
from gpudash.tui.widgets.view import DashView

HISTORY_REFRESH_S = 15.0  # the drill-down's range plots (the last hour, 30 s steps) are asked again this often
_STATE_ORDER = {DOWN: 0, PARTLY: 1, STALE: 2, NO_METRICS: 3}
STATE_STYLE = {DOWN: "bold red", PARTLY: "yellow", STALE: "yellow", NO_METRICS: "yellow"}


SORTS: tuple[Sort[FleetBox], ...] = (
    Sort("box", lambda b: b.box, False),
    Sort("state", lambda b: _STATE_ORDER.get(b.status, 3), False),  # the boxes needing a look first
    Sort("alerts", lambda b: len(b.alerts), True),
    Sort("util", lambda b: b.util, True),
    Sort("VRAM", lambda b: b.mem_used, True),
    Sort("PCIe", lambda b: None if b.tx_bps is None else (b.tx_bps or 0) + (b.rx_bps or 0), True),
    Sort("GPUs", lambda b: b.gpu_count, True),
)


def fleet_settings(app: Any) -> Any:
    """The [fleet] section the app runs with (a replay has none), or None."""
    config = getattr(getattr(app, "feed", None), "config", None)
    return getattr(config, "fleet", None)


def shown_boxes(boxes: tuple[FleetBox, ...], sort: int, text: str) -> list[FleetBox]:
    """Boxes whose host, targets, host name, rig, state, exporters, servers or alerts contain `text` (any case),
    in sort order."""
    def words(b: FleetBox) -> str:
        return " ".join([b.box, *(t.instance for t in b.targets), b.hostname or "", b.rig or "", b.status,
                         *b.exports, *(s.server for s in b.servers), *b.alerts]).lower()

    return filter_and_sort(boxes, SORTS[sort], text, words, lambda b: b.box)


class FleetLines(TextLines):
    """The Fleet's lines: a new height is a new page size (a resize, or the lines above it changing
    height), so the view draws its page again."""

    def on_resize(self) -> None:
        view = self.parent
        if isinstance(view, FleetView) and view.on_screen:
            view.show(view.state)


class FleetView(DashView, KeepsSelection):
    """The rows are lines of one TextLines (gpudash/tui/widgets/lines.py), which repaints only the lines
    whose text changed: a DataTable re-renders every visible cell on any change (its render cache is keyed
    on a table-wide update count), and a fleet's rows change at every read somewhere."""

    COLUMNS = COLUMNS
    DROP = ("from", "J/token", "host", "rig", "servers", "VRAM", "PCIe TX / RX")  # given way in this order on a
    # narrow screen
    RIGHT = ("GPUs", "util", "J/token")

    sort = 1  # by state: down and stale boxes first
    _shown: list[FleetBox] = []
    fleet: Fleet | None = None
    error: str | None = None
    stale_since: float | None = None  # when reads began to fail (the rows are from before)
    _polling = False  # a read is running or scheduled

    def __init__(self, *children: Any, id: str | None = None) -> None:
        super().__init__(*children, id=id)
        self._reader: FleetReader | None = None
        self._reader_lock = threading.Lock()
        self._head: Text | None = None
        self._note = ""
        self.top = 0  # the first box on the page shown
        self.rows: list[dict[str, str]] = []  # the cells of the boxes shown, in order (what the lines say)
        self._drawn_fleet: Fleet | None = None  # what the lines were last drawn from (draw skips a repeat)
        self._drawn_from: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static("Fleet", classes="view-title")
        yield Static("", classes="empty")
        yield FleetLines(id="fleet-lines")
        yield Static("", classes="hidden-columns")

    def shown(self, previous: Any) -> None:
        if fleet_settings(self.app) is not None and fleet_settings(self.app).prometheus and not self._polling:
            self._polling = True
            self._poll()

    def reader(self) -> FleetReader:
        """The fleet's reader, made on first use and kept (its client is made in a worker thread)."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = FleetReader(fleet_settings(self.app))
            return self._reader

    def _poll(self) -> None:
        if not self.on_screen:
            self._polling = False  # starts again when the tab is shown
            return
        self.run_in_thread(self._read, "fleet.read", "fleet")

    def _read(self) -> None:
        try:
            self.post_message(msg.FleetRead(self.reader().boxes(), None))
        except PrometheusError as err:
            self.post_message(msg.FleetRead(None, str(err)))

    def worker_failed(self, name: str) -> None:
        """An unexpected failure is reported by the app; the chain goes on, the rows go stale."""
        if name == "fleet.read":
            self.on_fleet_read(msg.FleetRead(None, "reading the fleet failed (see Events)"))

    def on_fleet_read(self, message: msg.FleetRead) -> None:
        message.stop()
        if message.fleet is not None:
            self.fleet, self.error, self.stale_since = message.fleet, None, None
        else:
            self.error = message.error
            self.stale_since = self.stale_since or time.time()
        if self.on_screen:
            self.show(self.state)  # repaints only the title line and the rows whose text changed
        self.set_timer(fleet_settings(self.app).refresh_s, self._poll)

    def on_unmount(self) -> None:
        if self._reader is not None:
            self._reader.close()

    def _title(self, head: Text) -> None:
        if head != self._head:  # an unchanged title is not laid out again
            self._head = head
            self.query_one(".view-title", Static).update(head)

    def draw(self, state: ViewState) -> None:
        settings = fleet_settings(self.app)
        empty = self.query_one(".empty", Static)
        if settings is None or not settings.prometheus:
            self._title(Text("Fleet: no Prometheus set ([fleet] prometheus, or launch --fleet URL)"))
            empty.update("gpudash asks no Prometheus until one is set")
            empty.display = True
            self._lines([], [])
            return
        # The app redraws the view on screen at every tick, but the Fleet draws from its own reads alone:
        # only a read, a key or a new size changes what it shows (the redraw was most of the tab's CPU).
        drawn_from = (self.error, self.stale_since, self.sort, self.filter_text, self.cursor,
                      self.query_one("#fleet-lines", TextLines).size)
        if self.fleet is self._drawn_fleet and drawn_from == self._drawn_from:
            return
        self._drawn_fleet, self._drawn_from = self.fleet, drawn_from
        boxes = self.fleet.boxes if self.fleet is not None else ()
        shown = shown_boxes(boxes, self.sort, self.filter_text)
        self._shown = shown
        self.follow_selection([b.box for b in shown])
        s = SORTS[self.sort]
        head = Text(f"Fleet {len(shown)} of {len(boxes)} boxes from {settings.prometheus}, by {s.column} "
                    "(o: sort, /: filter, Enter: open)")
        if self.filter_text:
            head.append(f"  filter {printable(repr(self.filter_text))}", style="bold magenta")
        self._title(head)
        # The title is one line: why the fleet cannot be read goes under it, in full (it wraps).
        if self.error is not None:
            error = printable(self.error)
            note = Text(f"stale since {fmt.clock(self.stale_since)}: {error}" if boxes else error, style="bold red")
        elif self.fleet is None:
            note = Text(f"asking Prometheus at {settings.prometheus}…", style="italic")
        elif not shown:
            note = Text(f"no box matches {printable(repr(self.filter_text))}" if boxes else
                        f"Prometheus at {settings.prometheus} scrapes no gpudash, dcgm-exporter, vLLM or "
                        "llama-server targets" + (" of that job" if settings.job else ""))
        else:
            note = None
        empty.display = note is not None
        if note is not None:
            empty.update(note)
        self.rows = [box_cells(b) for b in shown]
        self._lines(self.rows, shown)

    def _lines(self, rows: list[dict[str, str]], boxes: list[FleetBox]) -> None:
        """The header and a line per box of the page the cursor is on, in the columns that fit
        (fit_columns drops DROP's in order). Only the lines on screen are rendered: with a hundred boxes
        whose figures all move, rendering the off-screen ones was most of the tab's cost."""
        lines = self.query_one("#fleet-lines", TextLines)
        width, page = max(20, lines.size.width), max(1, lines.size.height - 1)
        if not self.top <= self.cursor < self.top + page:
            self.top = self.cursor if self.cursor < self.top else self.cursor - page + 1
        self.top = max(0, min(self.top, len(rows) - page))
        cells = [[r[c] for c in self.COLUMNS] for r in rows]
        fit = fit_columns(self.COLUMNS, cells, self.DROP, width)
        widths = {i: max([len(self.COLUMNS[i]), *(len(c[i]) for c in cells)]) for i in fit.shown}
        state_at = sum(widths[i] + 2 for i in fit.shown if i < self.COLUMNS.index("state"))

        def line(values: list[str], style: str = "") -> Text:
            text = Text(style=style, no_wrap=True, overflow="ellipsis")
            for i in fit.shown:
                v = values[i]
                text.append((v.rjust if self.COLUMNS[i] in self.RIGHT else v.ljust)(widths[i]) + "  ")
            text.truncate(width, overflow="ellipsis")  # one screen line each: the edge cuts the last column
            return text

        out = [line(list(self.COLUMNS), "bold")] if rows else []
        for n in range(self.top, min(len(rows), self.top + page)):
            text = line(cells[n], "reverse" if n == self.cursor else "")
            style = STATE_STYLE.get(boxes[n].status)
            if style:
                text.stylize(style, state_at, state_at + len(cells[n][self.COLUMNS.index("state")]))
            out.append(text)
        lines.show(out)
        hidden = [self.COLUMNS[i] for i in range(len(self.COLUMNS)) if i not in fit.shown] if rows else []
        if len(rows) > page:
            hidden_note = f"boxes {self.top + 1}-{min(len(rows), self.top + page)} of {len(rows)} (up/down)"
        else:
            hidden_note = ""
        note = self.query_one(".hidden-columns", Static)
        text = "; ".join(filter(None, [hidden_note, f"not shown at this width: {', '.join(hidden)} (widen the "
                                                   "terminal)" if hidden else ""]))
        note.display = bool(text)
        if text != self._note:
            self._note = text
            note.update(text)

    def action_select(self, step: int) -> None:
        if self.step_selection(step, [b.box for b in self._shown]):
            self.show(self.state)

    def action_sort_fleet(self) -> None:
        self.sort = (self.sort + 1) % len(SORTS)
        self.show(self.state)

    def action_filter_fleet(self) -> None:
        self.ask_filter("boxes", "address, host, rig, state, servers or alerts")

    def action_open_box(self) -> None:
        if not self._shown:
            self.notify("no box selected", severity="warning")
            return
        self.app.push_screen(BoxScreen(self._shown[self.cursor], self))


class BoxScreen(Screen[None]):
    """One box of the fleet: what it is, its servers, and its GPUs over the last hour (range queries)."""

    BINDINGS = [Binding("escape,q", "close", "Back to the fleet", id="box.close")]

    def __init__(self, box: FleetBox, view: FleetView) -> None:
        super().__init__(id="box-screen")
        self.box, self.view = box, view
        self.series: dict[str, dict[str, list[tuple[float, float]]]] = {}
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="box-title")
        yield FittedTable(SERVER_COLUMNS[1:], id="box-servers")
        with Grid(id="box-plots"):
            for name in ("util", "memory", "pcie tx", "pcie rx"):
                yield PlotextPlot(id=f"box-{name.replace(' ', '-')}")
        yield Static("Esc: back to the fleet", id="box-keys")

    def on_mount(self) -> None:
        self._servers()
        self._draw()
        self._load()

    def _servers(self) -> None:
        b = self.box
        self.query_one("#box-servers", FittedTable).set_rows(
            [tuple(server_cells(b, s)[c] for c in SERVER_COLUMNS[1:]) for s in b.servers])

    def _load(self) -> None:
        box = self.box

        def read() -> None:
            try:
                series, again = self.view.reader().box(box)  # its servers with TTFT, hit rate, KV
                self.post_message(msg.BoxHistory(box.box, series, None, again))
            except PrometheusError as err:
                self.post_message(msg.BoxHistory(box.box, None, str(err), None))

        self.run_worker(read, name="fleet.box_history", group="fleet-box", thread=True, exit_on_error=False)

    def on_box_history(self, message: msg.BoxHistory) -> None:
        message.stop()
        if message.series is not None:
            self.series, self.error = message.series, None
        else:
            self.error = message.error
        if message.box is not None:
            self.box = message.box
            self._servers()
        self._draw()
        self.set_timer(HISTORY_REFRESH_S, self._load)

    def _draw(self) -> None:
        b = self.box
        cells = box_cells(b, time.time())
        facts = "  ".join(printable(f"{what} {v}") for what, v in (("driver", b.driver), ("CUDA", b.cuda),
                                                                  ("gpudash", b.version)) if v)
        head = Text(f"{cells['box']}  {cells['host']}  {cells['rig']}  {facts}  from {cells['from']}  ", style="bold")
        head.append(cells["state"], style="bold red" if b.status == DOWN else "")
        if b.alerts:
            head.append(f"\nalerts firing: {cells['alerts']}", style="bold red")
        if not b.servers:
            head.append("\nno servers")
        if self.error is not None:
            head.append(f"\nthe last hour could not be read: {printable(self.error)}", style="bold red")
        self.query_one("#box-title", Static).update(head)
        units = {"util": ("GPU utilisation, %", 100.0), "memory": ("GPU memory used, GiB", 1 / 2**30),
                 "pcie tx": ("PCIe TX (GPU to host), GB/s", 1e-9), "pcie rx": ("PCIe RX (host to GPU), GB/s", 1e-9)}
        now = time.time()
        for name, (label, scale) in units.items():
            w = self.query_one(f"#box-{name.replace(' ', '-')}", PlotextPlot)
            plt = w.plt
            plt.clear_data()
            plt.clear_figure()
            plt.title(f"{label}, last hour (minutes ago)")
            for gpu, points in sorted(self.series.get(name, {}).items()):
                if points:
                    plt.plot([(t - now) / 60 for t, _ in points], [v * scale for _, v in points],
                             marker="braille", label=f"GPU{gpu}")
            w.refresh()

    def action_close(self) -> None:
        self.app.pop_screen()
