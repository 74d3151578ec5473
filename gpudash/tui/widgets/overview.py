"""Overview: one card per GPU (1-8 fit at 120x40 without scrolling) and a host line."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container, Vertical
from textual.widgets import Sparkline, Static

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


def card_text(g: GpuSample, sim: bool) -> Text:
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
    t.append(f"RX {fmt.rate(g.pcie_rx_bps):>10} {fmt.pct(link.rx_fraction):>4} of link", style="cyan")
    return t


class GpuCard(Vertical):
    """One GPU: text block plus TX and RX sparklines (the live PCIe plot, GB/s over the last minute)."""

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-{index}", classes="gpu-card")
        self.index = index
        self._ready = False
        self._waiting: tuple | None = None  # the latest update that arrived before the card was mounted

    def on_mount(self) -> None:
        self._ready = True
        if self._waiting is not None:
            self.update_card(*self._waiting)

    def compose(self) -> ComposeResult:
        yield Static(id=f"gpu-{self.index}-text", classes="gpu-text")
        yield Sparkline([], id=f"gpu-{self.index}-tx", classes="spark-tx", summary_function=max)
        yield Sparkline([], id=f"gpu-{self.index}-rx", classes="spark-rx", summary_function=max)

    def update_card(self, g: GpuSample, state: ViewState, sim: bool, selected: bool) -> None:
        if not self._ready:
            self._waiting = (g, state, sim, selected)
            return
        self.query_one(".gpu-text", Static).update(card_text(g, sim))
        tx, rx = state.pcie.get(g.index, ((), ()))
        self.query_one(".spark-tx", Sparkline).data = list(tx)
        self.query_one(".spark-rx", Sparkline).data = list(rx)
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
        self.query_one("#host-line", Static).update(line)
