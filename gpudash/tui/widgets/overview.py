"""Overview: one card per GPU (1-8 fit at 120x40 without scrolling) and a host line."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container, Vertical
from textual.widgets import Static

from gpudash.records import GpuSample
from gpudash.tui.state import ViewState, link_status
from gpudash.tui.widgets import fmt


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


def plot_rows(values: list[float], width: int, rows: int = PLOT_ROWS) -> list[str]:
    """A multi-row bar plot of 0..1 values (newest on the right), as text lines: cheap to redraw each tick."""
    vals = [max(0.0, min(1.0, v)) for v in values[-width:]]
    vals = [0.0] * (width - len(vals)) + vals
    lines = []
    for r in range(rows):
        base = (rows - 1 - r) * 8
        lines.append("".join(_LEVELS[max(0, min(8, round(v * rows * 8) - base))] for v in vals))
    return lines


def card_text(g: GpuSample, sim: bool, tx_hist: list[float] = (), rx_hist: list[float] = (),
              width: int = 26) -> Text:
    """The card's text lines: name, util, memory, power/temperature, link, PCIe TX/RX."""
    link = link_status(g)
    t = Text()
    t.append(f"GPU{g.index} ", style="bold")
    t.append(g.name.removeprefix("NVIDIA "))
    if sim:
        t.append(" SIM", style="bold black on yellow")
    t.append("\n")
    util = None if g.util_pct is None else g.util_pct / 100
    t.append(f"util {_bar(util, 8)} {fmt.num(g.util_pct, '.0f', '%')}\n")
    mem = g.mem_used / g.mem_total if g.mem_used is not None and g.mem_total else None
    t.append(f"mem  {_bar(mem, 8)} {_pair(g.mem_used, g.mem_total)}\n")
    t.append(f"{fmt.num(g.power_w, '.0f', ' W')}  {fmt.num(g.temp_c, '.0f', ' °C')}\n")
    t.append(f"link {link.text}\n", style="bold red" if link.warn else "")
    if link.warn:
        t.append("DOWNGRADED while busy\n", style="bold white on red")
    t.append(f"TX {fmt.rate(g.pcie_tx_bps):>10} {fmt.pct(link.tx_fraction):>4} of link\n", style="green")
    for line in plot_rows(list(tx_hist), width):
        t.append(line + "\n", style="green")
    t.append(f"RX {fmt.rate(g.pcie_rx_bps):>10} {fmt.pct(link.rx_fraction):>4} of link\n", style="cyan")
    t.append("\n".join(plot_rows(list(rx_hist), width)), style="cyan")
    return t


class GpuCard(Static):
    """One GPU: its numbers, and TX / RX plots as a share of what the link can carry (last minute)."""

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-{index}", classes="gpu-card")
        self.index = index
        self._last: tuple | None = None
        self._width = 0  # the plot width the current text was built for

    def on_resize(self) -> None:
        # A hidden view's cards are resized to nothing and back on every view switch: rebuild only when
        # the width really changed (a rebuild costs a second full render of the Overview).
        if self._last is not None and self._plot_width() != self._width:
            self.update_card(*self._last)  # the plots take the card's new width

    def _plot_width(self) -> int:
        return max(8, self.content_size.width or 26)

    def update_card(self, g: GpuSample, state: ViewState, sim: bool, selected: bool) -> None:
        self._last = (g, state, sim, selected)
        tx, rx = state.link_history.get(g.index, ((), ()))
        self._width = self._plot_width()
        # The card's size comes from the grid, never from its text: skip the layout pass on every tick.
        self.update(card_text(g, sim, list(tx), list(rx), self._width), layout=False)
        self.set_class(selected, "selected")
        self.set_class(link_status(g).warn, "downgraded")


class OverviewView(Vertical):
    """GPU cards in a grid of up to four columns, plus host CPU and memory."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self._count = -1

    def compose(self) -> ComposeResult:
        yield Static("waiting for the first sample…", id="host-line")
        yield Container(id="gpu-grid")

    def update_view(self, state: ViewState, selected_gpu: int) -> None:
        snap = state.latest
        if snap is None:
            return
        grid = self.query_one("#gpu-grid", Container)
        if len(snap.gpus) != self._count:
            self._count = len(snap.gpus)
            grid.remove_children()
            grid.mount_all([GpuCard(g.index) for g in snap.gpus])
            cols = 1 if self._count <= 1 else 2 if self._count <= 4 else 4
            grid.styles.grid_size_columns = cols
        for g in snap.gpus:
            grid.query_one(f"#gpu-{g.index}", GpuCard).update_card(g, state, snap.is_sim, g.index == selected_gpu)
        h = snap.host
        line = Text()
        if h is not None:
            mem = h.mem_used / h.mem_total if h.mem_used is not None and h.mem_total else None
            line.append(f"host CPU {_bar(None if h.cpu_pct is None else h.cpu_pct / 100)} "
                        f"{fmt.num(h.cpu_pct, '.0f', '%')}   ")
            line.append(f"mem {_bar(mem)} {fmt.size(h.mem_used)}/{fmt.size(h.mem_total)}   ")
            line.append(f"gpudash CPU {fmt.num(h.gpudash_cpu_pct, '.1f', '%')} RSS {fmt.size(h.gpudash_rss)}")
        if snap.errors:
            line.append(f"   {len(snap.errors)} source error(s): {snap.errors[0]}", style="bold red")
        self.query_one("#host-line", Static).update(line, layout=False)  # one fixed line
