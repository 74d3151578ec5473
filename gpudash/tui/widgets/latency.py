"""Latency: TTFT over time, prefix-cache hit fraction over time, TTFT vs hit scatter + correlation."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from gpudash.launcher.cache_kinds import summary, summary_text
from gpudash.tui.state import ViewState

SHOWN = 300  # most recent probe requests plotted


def correlation_text(requests: list) -> str:
    """Pearson/Spearman and n from the launcher's correlation (computed in the core, not here)."""
    try:
        from gpudash.launcher.correlation import ttft_hit_correlation
    except ImportError:
        return "correlation: unavailable (gpudash.launcher.correlation is not installed)"
    c = ttft_hit_correlation(requests)

    def f(x: float | None) -> str:
        return "—" if x is None else f"{x:+.2f}"

    return f"TTFT vs prefix-cache hit: Pearson {f(c.pearson)}  Spearman {f(c.spearman)}  n={c.n}"


class LatencyView(Vertical):
    def compose(self) -> ComposeResult:
        yield Static("correlation: no probe requests yet", id="corr")
        yield Static("prompt cache: no probe requests yet", id="cache-kinds")
        with Horizontal(id="latency-series"):
            yield PlotextPlot(id="ttft-plot")
            yield PlotextPlot(id="hit-plot")
        yield PlotextPlot(id="scatter-plot")

    def update_view(self, state: ViewState) -> None:
        reqs = [r for r in list(state.requests)[-SHOWN:] if r.ok and r.ttft_s is not None]
        self.query_one("#corr", Static).update(correlation_text(reqs) if reqs else
                                               "correlation: no probe requests yet", layout=False)
        self.query_one("#cache-kinds", Static).update(
            "prompt cache: " + summary_text(summary(reqs, state.events)) if reqs else
            "prompt cache: no probe requests yet", layout=False)
        t0 = reqs[0].ts if reqs else 0.0
        xs = [r.ts - t0 for r in reqs]
        ttft = [r.ttft_s * 1000 for r in reqs]
        hits = [(r.ts - t0, r.hit_fraction) for r in reqs if r.hit_fraction is not None]
        self._plot("#ttft-plot", "TTFT (ms) over time (s)", xs, ttft, scatter=False)
        self._plot("#hit-plot", "prefix-cache hit fraction over time (s)",
                   [h[0] for h in hits], [h[1] for h in hits], scatter=False)
        pairs = [(r.hit_fraction, r.ttft_s * 1000) for r in reqs if r.hit_fraction is not None]
        self._plot("#scatter-plot", "TTFT (ms) vs prefix-cache hit fraction",
                   [p[0] for p in pairs], [p[1] for p in pairs], scatter=True)

    def _plot(self, sel: str, title: str, xs: list, ys: list, scatter: bool) -> None:
        w = self.query_one(sel, PlotextPlot)
        plt = w.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title)
        if xs:
            (plt.scatter if scatter else plt.plot)(xs, ys, marker="dot" if scatter else "braille")
        w.refresh()
