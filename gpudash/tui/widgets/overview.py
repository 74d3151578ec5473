"""Overview: one card per GPU (1-8 fit at 120x40 without scrolling) and a host line."""

from __future__ import annotations

import functools
import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container
from textual.widgets import Static

from gpudash.outside import printable
from gpudash.records import Event, GpuSample, HostSample, Snapshot
from gpudash.telemetry.links import link_status
from gpudash.tui.state import ViewState
from gpudash.tui.widgets.energy import overview_line
from gpudash.tui.widgets.lines import TextLines
from gpudash.tui.widgets.fitted import FittedTable
from gpudash.tui.widgets.processes import ProcessesView, ShowsProcesses, cells, process_rows, shown_rows
from gpudash.tui.widgets.lines import Line  # a Static that an unchanged update leaves alone
from gpudash import fmt


def _bar(frac: float | None, width: int = 10) -> str:
    if frac is None:
        return "·" * width
    n = round(max(0.0, min(1.0, frac)) * width)
    return "█" * n + "░" * (width - n)


def _pair(used: int | None, total: int | None) -> str:
    """'12/96 GiB' (one decimal below 10 GiB) so a card line fits 26 columns."""
    if used is None or total is None:
        return f"{fmt.size(used)}/{fmt.size(total)}"
    u, t = used / 2**30, total / 2**30
    return f"{u:.1f}/{t:.0f} GiB" if u < 10 else f"{u:.0f}/{t:.0f} GiB"


_LEVELS = " ▁▂▃▄▅▆▇█"
PLOT_ROWS = 3


@functools.lru_cache(maxsize=None)
def _columns(rows: int) -> tuple[tuple[str, ...], ...]:
    """For each bar height in eighths of a row (0 .. rows * 8), the column's characters, top row first.
    The bottom row never drops below ▁, a baseline, so an idle link still draws its axis."""
    return tuple(tuple(_LEVELS[max(1 if r == rows - 1 else 0, min(8, h - (rows - 1 - r) * 8))] for r in range(rows))
                 for h in range(rows * 8 + 1))


def plot_rows(values: list[float], width: int, rows: int = PLOT_ROWS) -> list[str]:
    """A multi-row bar plot of 0..1 values (newest on the right), as text lines: cheap to redraw each tick
    (a column per value from a table, the rows joined in C)."""
    if rows <= 0:
        return []
    scale, columns = rows * 8, _columns(rows)
    vals = values[-width:] if width > 0 else []
    heights = [0] * (width - len(vals)) + [round(max(0.0, min(1.0, v)) * scale) for v in vals]
    return ["".join(row) for row in zip(*(columns[h] for h in heights))] if heights else [""] * rows


FULL_LINES = 7  # name, util, mem, power/temp, link, TX, RX: the full card before its plots
COMPACT_WIDTH = 24  # below this many columns a card switches to short lines
TALL_ROWS = 8  # plot rows at most in a tall card (few GPUs), where util and memory history join PCIe


def _line(text: str, style: str = "") -> Text:
    """One card line, its style as a span (what appending to one Text gave; Textual maps a base
    style's colours apart from the theme's)."""
    t = Text()
    t.append(text, style=style)
    return t


def card_lines(g: GpuSample, sim: bool, tx_hist: list[float] = (), rx_hist: list[float] = (),
               width: int = 26, height: int = FULL_LINES + 2 * PLOT_ROWS, selected: bool = False,
               util_hist: list[float] = (), mem_hist: list[float] = (), fault: Event | None = None) -> list[Text]:
    """The card's lines: name, util, memory, power/temperature, link, PCIe TX/RX, each with a plot of
    as many rows as the height leaves. In a narrow or short card the lines get short and PCIe comes
    right after the name: it is the headline, and the last thing to lose. A driver fault (Xid, ECC,
    lost GPU) seen this session goes right under the name, above everything."""
    link = link_status(g)
    name = _line(f"GPU{g.index} ", "bold reverse" if selected else "bold")
    name.append(g.name.removeprefix("NVIDIA "), style="reverse" if selected else "")
    if sim:
        name.append(" SIM", style="bold black on yellow")
    lines = [name]
    add = lines.append

    def plot(head: str, hist: list[float], style: str, rows: int) -> None:
        add(_line(head, style))
        lines.extend(_line(row, style) for row in (plot_rows(list(hist), width, rows) if rows else ()))

    if fault is not None:
        when = time.strftime('%H:%M:%S', time.localtime(fault.ts))
        add(_line(f"{when} {fault.reason}"[:width], "bold white on red"))
        height -= 1
    util = None if g.util_pct is None else g.util_pct / 100
    mem = g.mem_used / g.mem_total if g.mem_used is not None and g.mem_total else None
    warn = 1 if link.warn else 0
    if width < COMPACT_WIDTH or height < FULL_LINES + warn:
        rows = max(0, (height - 6 - warn) // 2)
        for label, bps, frac, hist, style in (("TX", g.pcie_tx_bps, link.tx_fraction, tx_hist, "green"),
                                              ("RX", g.pcie_rx_bps, link.rx_fraction, rx_hist, "cyan")):
            gb = "—" if bps is None else f"{bps / 1e9:.1f}G"
            plot(f"{label} {gb:>6} {fmt.pct(frac):>4}", hist, style, min(rows, PLOT_ROWS))
        cur = f"gen{g.link_gen or '?'}x{g.link_width or '?'}"
        add(_line(f"link {cur}{' LOW' if link.warn else ''}", "bold red" if link.warn else ""))
        used = "—" if g.mem_used is None or not g.mem_total else f"{g.mem_used / 2**30:.0f}/{g.mem_total / 2**30:.0f}GiB"
        add(_line(f"{fmt.num(g.util_pct, '.0f', '%')} {used}"))
        add(_line(f"{fmt.num(g.power_w, '.0f', 'W')} {fmt.num(g.temp_c, '.0f', '°C')}"))
        return lines
    tall = height >= FULL_LINES + warn + 3 + 4 * PLOT_ROWS  # room for clocks/ECC, util and memory history
    rows = min(TALL_ROWS, (height - FULL_LINES - warn - 3) // 4) if tall \
        else max(0, min(PLOT_ROWS, (height - FULL_LINES - warn) // 2))
    add(_line(f"util {_bar(util, 8)} {fmt.num(g.util_pct, '.0f', '%')}"))
    add(_line(f"mem  {_bar(mem, 8)} {_pair(g.mem_used, g.mem_total)}"))
    add(_line(f"{fmt.num(g.power_w, '.0f', ' W')}  {fmt.num(g.temp_c, '.0f', ' °C')}"))
    add(_line(f"link {link.text}", "bold red" if link.warn else ""))
    if link.warn:
        add(_line("DOWNGRADED while busy", "bold white on red"))
    plot(f"TX {fmt.rate(g.pcie_tx_bps):>10} {fmt.pct(link.tx_fraction):>4} of link", tx_hist, "green", rows)
    plot(f"RX {fmt.rate(g.pcie_rx_bps):>10} {fmt.pct(link.rx_fraction):>4} of link", rx_hist, "cyan", rows)
    if tall:
        add(_line(f"SM {fmt.num(g.sm_clock_mhz, 'd', ' MHz')} held down by {fmt.held_down_by(g.throttle)}  "
                  f"ECC {fmt.num(g.ecc_uncorrected, 'd')} remapped {fmt.num(g.remapped_rows, 'd')}",
                  "bold red" if g.ecc_uncorrected or g.remapped_rows else ""))
        plot("util history", util_hist, "yellow", rows)
        plot("mem history", mem_hist, "magenta", rows)
    return lines


def own_vram(snap: Snapshot) -> int | None:
    """GPU memory gpudash's own process holds (its CUDA context, once the engine runs); None: unknown."""
    if snap.host is None or snap.host.gpudash_pid is None:
        return None
    return sum(p.used_bytes or 0 for p in snap.gpu_processes if p.pid == snap.host.gpudash_pid)


def host_line(h: HostSample | None, width: int, vram: int | None = None) -> Text:
    """Host CPU and memory, and what gpudash itself holds (CPU, RSS, VRAM), in one line of `width` cells:
    the bars go first when it is narrow (80 columns keeps every number)."""
    line = Text()
    if h is None:
        return line
    mem = h.mem_used / h.mem_total if h.mem_used is not None and h.mem_total else None
    cpu = None if h.cpu_pct is None else h.cpu_pct / 100
    own = f"gpudash CPU {fmt.num(h.gpudash_cpu_pct, '.1f', '%')} RSS {fmt.size(h.gpudash_rss)} VRAM {fmt.size(vram)}"
    used = f"{fmt.size(h.mem_used)}/{fmt.size(h.mem_total)}"
    wide = f"host CPU {_bar(cpu)} {fmt.num(h.cpu_pct, '.0f', '%')}   mem {_bar(mem)} {used}   {own}"
    line.append(wide if len(wide) <= width else f"host CPU {fmt.num(h.cpu_pct, '.0f', '%')}  mem {used}  {own}")
    return line


class GpuCard(TextLines):
    """One GPU: its numbers, and TX / RX plots as a share of what the link can carry (last minute)."""

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-{index}", classes="gpu-card")
        self.index = index
        self._last: tuple | None = None
        self._built_for = (0, 0)  # the (width, height) the current lines were built for

    def on_resize(self) -> None:
        # A hidden view's cards are resized to nothing and back on every view switch: rebuild only when
        # the size really changed.
        if self._last is not None and self._plot_size() != self._built_for and self.content_size.height:
            self.update_card(*self._last)  # the lines and plots take the card's new size

    def _plot_size(self) -> tuple[int, int]:
        return max(8, self.content_size.width or 26), self.content_size.height or FULL_LINES + 2 * PLOT_ROWS

    def update_card(self, g: GpuSample, state: ViewState, sim: bool, selected: bool) -> None:
        self._last = (g, state, sim, selected)
        tx, rx = state.link_history.get(g.index, ((), ()))
        util, mem = state.use_history.get(g.index, ((), ()))
        self._built_for = self._plot_size()
        self.show(card_lines(g, sim, tx, rx, *self._built_for, selected=selected, util_hist=util, mem_hist=mem,
                             fault=state.faults.get(g.index)))
        self.set_class(selected, "selected")
        self.set_class(link_status(g).warn, "downgraded")


PROCS_SHOWN = 4  # the Overview's short process list: the biggest VRAM holders (9 shows them all)
MIN_CARD_HEIGHT = 8  # a compact card: name, TX, RX, link, util and memory, power (6 lines) in its border


class OverviewView(ShowsProcesses):
    """GPU cards in a grid of up to four columns, plus host CPU and memory, and under them (when there is
    room) the processes holding the most VRAM, as nvitop lists them; `g` and up/down select a card."""

    selected_gpu = 0

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self._host = Static("waiting for the first sample…", id="host-line")
        self._energy = Static("", id="energy-line")  # each counted server's J/token (tui/widgets/energy.py)
        self._energy.display = False
        self._grid = Container(id="gpu-grid")
        self._cards: dict[int, GpuCard] = {}  # held, not queried each tick (a query walks the DOM)
        self._procs_title = Line("", id="overview-procs-title", classes="view-title")  # updated every tick
        self._procs = FittedTable(ProcessesView.COLUMNS, ProcessesView.DROP, id="overview-procs")
        self._procs_title.display = self._procs.display = False  # until the first tick says how many fit

    def compose(self) -> ComposeResult:
        yield self._host
        yield self._energy
        yield self._grid
        yield self._procs_title
        yield self._procs

    def action_select(self, step: int) -> None:
        n = len(self.state.latest.gpus) if self.state.latest else 0
        if n:
            self.selected_gpu = (self.selected_gpu + step) % n
            self.show(self.state)

    def action_select_gpu(self) -> None:
        self.action_select(1)

    def draw(self, state: ViewState) -> None:
        snap = state.latest
        selected_gpu = self.selected_gpu
        if snap is None:
            return
        if [g.index for g in snap.gpus] != list(self._cards):
            self._cards = {g.index: GpuCard(g.index) for g in snap.gpus}
            self._grid.remove_children()
            self._grid.mount_all(self._cards.values())
            count = len(self._cards)
            self._grid.styles.grid_size_columns = 1 if count <= 1 else 2 if count <= 4 else 4
        for g in snap.gpus:
            self._cards[g.index].update_card(g, state, snap.is_sim, g.index == selected_gpu)
        line = host_line(snap.host, self._host.size.width or 120, own_vram(snap))
        if snap.errors:
            line.append(f"   {len(snap.errors)} source error(s): {printable(snap.errors[0])}", style="bold red")
        energy = overview_line(snap.server_energy, self._host.size.width or 120)
        self._energy.display = bool(energy)
        if energy != self._energy.content:
            self._energy.update(energy, layout=False)
        self._draw_processes(state)
        if line != self._host.content:
            self._host.update(line, layout=False)  # one fixed line

    def on_resize(self) -> None:
        if self.state.latest is not None:
            self._draw_processes(self.state)

    def _rows_room(self) -> int:
        """Process rows that fit under the cards, each card keeping MIN_CARD_HEIGHT (its PCIe lines): four at
        80x24 with 1-4 GPUs, one with 8; 0 (no table) where the cards need all of it."""
        columns = self._grid.styles.grid_size_columns or 1
        card_rows = -(-max(1, len(self._cards)) // columns)
        lines = 1 + bool(self._energy.display)  # the host line, and the energy line where there is one
        spare = self.size.height - lines - card_rows * MIN_CARD_HEIGHT - 2  # the title and the header
        return max(0, min(PROCS_SHOWN, spare))

    def _draw_processes(self, state: ViewState) -> None:
        """The processes holding the most VRAM, as many as fit: decided from the view's height, so the table
        does not show on the first frame and vanish on the next."""
        if not self.size.height or state.latest is None:
            return
        room = self._rows_room()
        rows = process_rows(state.latest, state.proc_info)
        self._procs_title.display = room > 0
        self._procs.display = room > 0 and bool(rows)
        if not room:
            return
        self.look_up(state)
        top = shown_rows(rows, 0, "")[:room]
        more = f", {len(rows) - len(top)} more" if len(rows) > len(top) else ""
        self._procs_title.update(f"Processes by VRAM ({len(top)} of {len(rows)}{more}; 9: all)" if rows
                                 else "Processes: none on the GPUs")
        self._procs.styles.max_height = 1 + max(1, len(top))  # the header and the rows shown
        self._procs.set_rows([cells(r) for r in top])
