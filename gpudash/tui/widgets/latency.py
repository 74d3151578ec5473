"""Latency: what each server says of its own latency (over the last minute), the probe's TTFT median/p90 and
hit rate as numbers, then TTFT over time, prefix-cache hit fraction over time, and TTFT vs hit as a scatter
with the correlation. Text from outside (a server's error message) is shown as text (outside.py); a block is
laid out again whenever its text changes, so a line that wraps is never cut; below SCATTER_MIN_HEIGHT rows
the scatter gives its room to the two series."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static
from textual_plotext import PlotextPlot

from gpudash.launcher.probe import cache_kinds
from gpudash.outside import printable
from gpudash.records import ServerSample
from gpudash.tui.state import ViewState
from gpudash.tui.widgets.servers import state_word
from gpudash.tui.widgets.view import DashView

SHOWN = 300  # most recent probe requests plotted
SCATTER_MIN_HEIGHT = 36  # rows of the view below which the scatter is left out (80x24 gave 2-row plots)


def summary_text(requests: list) -> str:
    """TTFT median/p90 (overall, cache hits, misses), the hit rate and the TTFT-hit correlation, as
    `gpudash probe` reports them (the numbers come from the core's summarize, not from here)."""
    from gpudash.launcher.probe.correlation import summarize

    s = summarize(requests)

    def ms(x: float | None) -> str:
        return "—" if x is None else f"{x:.0f} ms"

    def r(x: float | None) -> str:
        return "—" if x is None else f"{x:+.2f}"

    judged = s.hits + s.misses
    rate = f"{s.hits / judged * 100:.0f}%" if judged else "—"
    c = s.correlation
    return (f"TTFT median {ms(s.ttft_median_ms)}  p90 {ms(s.ttft_p90_ms)}  |  hit rate {rate} "
            f"({s.hits} hits: median {ms(s.hit_ttft_median_ms)}; {s.misses} misses: median "
            f"{ms(s.miss_ttft_median_ms)})  |  n={s.requests}, {s.failed} failed"
            f"{f' (last: {printable(s.last_error)})' if s.last_error else ''}  (the probe's requests)\n"
            f"TTFT vs prefix-cache hit: Pearson {r(c.pearson)}  Spearman {r(c.spearman)}  n={c.n}")


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:.0f}"


def _share(hits: float | None, queries: float | None) -> str:
    return f"{hits / queries:.0%}" if hits is not None and queries else "—"


def _own_figures(s: ServerSample) -> list[str]:
    """What a server says of itself over the last minute, each figure with its unit (empty: it said nothing)."""
    parts = []
    if s.ttft_p50_s is not None or s.ttft_mean_s is not None:
        parts.append(f"TTFT p50/p90/p99 {_ms(s.ttft_p50_s)}/{_ms(s.ttft_p90_s)}/{_ms(s.ttft_p99_s)} ms, "
                     f"mean {_ms(s.ttft_mean_s)} ms")
    if s.prefill_mean_s is not None:
        parts.append(f"prefill {_ms(s.prefill_mean_s)} ms/request")
    if s.prefill_busy is not None:  # llama-server: a batch shared by requests counts once, so no per-request figure
        parts.append(f"prefill busy {s.prefill_busy:.0%} of the time")
    if s.itl_mean_s is not None:
        parts.append(f"ITL mean {_ms(s.itl_mean_s)} ms" + (
            f" p90/p99 {_ms(s.itl_p90_s)}/{_ms(s.itl_p99_s)} ms" if s.itl_p99_s is not None else ""))
    if s.queue_mean_s is not None:
        parts.append(f"queue mean {_ms(s.queue_mean_s)} ms p99 {_ms(s.queue_p99_s)} ms")
    if s.prefix_cache_hit_rate is not None:
        parts.append(f"prefix-cache hits {s.prefix_cache_hit_rate:.0%}")
    if s.external_prefix_cache_queries is not None:  # the server's counters since it started: said so
        parts.append(f"host KV cache hits {_share(s.external_prefix_cache_hits, s.external_prefix_cache_queries)} "
                     "since it started")
    return parts


def server_text(servers: list[ServerSample]) -> str:
    """What each server says of itself, no probe needed, over the last minute: TTFT quantiles and mean from
    its own histogram (vLLM), prefill per request (vLLM's histogram) or, where the counters cannot give one,
    the share of time spent on prompts (llama-server), inter-token latency, queue time, and its prefix-cache
    hit rate; vLLM's host-memory KV cache is since it started, and says so. A server that said nothing (a
    found one, one not read yet) takes no line of dashes: they are named together on one line."""
    lines = []
    silent = []
    for s in servers:
        parts = _own_figures(s)
        if not parts:
            silent.append(f"{s.server} ({state_word(s)})")
            continue
        origin = f", {s.origin}" if s.origin != "managed" else ""
        lines.append(f"{s.server} ({s.kind}{origin}): " + "; ".join(parts))
    if lines:
        lines.insert(0, "each server's own figures over the last minute:")
    if silent:
        lines.append("no figures of their own from " + ", ".join(silent))
    return "\n".join(lines)


def cache_text(requests: list, events: list) -> Text:
    """Each server's in-slot hits, host-cache restores and misses; where its restores are slower than
    recomputing the prompt, a warning with the medians and what to change (the doctor's check, live)."""
    text = Text()
    for c in cache_kinds.by_server(requests, events):
        text.append(f"prompt cache of {c.server}: {cache_kinds.summary_text(c.stats)}\n")
        if c.restores_lose:
            text.append(f"  restores lose to recompute ({c.versus_text()}): {cache_kinds.SLOW_RESTORE_FIX}\n",
                        style="bold yellow")
    text.rstrip()
    return text


class LatencyView(DashView):
    _shown: dict[str, str]  # each text block's text as last drawn

    def compose(self) -> ComposeResult:
        self._shown = {}
        yield Static("", id="server-own")
        yield Static("no probe requests yet", id="corr")
        yield Static("prompt cache: no probe requests yet", id="cache-kinds")
        with Horizontal(id="latency-series"):
            yield PlotextPlot(id="ttft-plot")
            yield PlotextPlot(id="hit-plot")
        yield PlotextPlot(id="scatter-plot")

    def on_resize(self) -> None:
        self.query_one("#scatter-plot").display = self.size.height >= SCATTER_MIN_HEIGHT

    def _say(self, sel: str, text: Text | str) -> None:
        """Update a block only when its text changed, and then lay it out again: a wrapped line needs the
        height its new text takes (updating without layout cut lines until the terminal was resized)."""
        shown = text.plain if isinstance(text, Text) else text
        if self._shown.get(sel) != shown:
            self._shown[sel] = shown
            self.query_one(sel, Static).update(text)

    def draw(self, state: ViewState) -> None:
        recent = list(state.requests)[-SHOWN:]
        reqs = [r for r in recent if r.ok and r.ttft_s is not None]
        servers = list(state.latest.servers) if state.latest is not None else []
        self._say("#server-own", Text(server_text(servers)))
        self._say("#corr", summary_text(recent) if recent else (
            "no probe requests yet: the figures and plots below need the probe (off for attached servers unless "
            "their entry says probe = true)"))
        self._say("#cache-kinds", cache_text(reqs, list(state.events)) if reqs else Text("prompt cache: no probe requests yet"))
        t0 = reqs[0].ts if reqs else 0.0
        xs = [r.ts - t0 for r in reqs]
        ttft = [r.ttft_s * 1000 for r in reqs]
        hits = [(r.ts - t0, r.hit_fraction) for r in reqs if r.hit_fraction is not None]
        self._plot("#ttft-plot", "TTFT (ms) over time (s)", xs, ttft, scatter=False)
        self._plot("#hit-plot", "cache hit fraction over time (s)",
                   [h[0] for h in hits], [h[1] for h in hits], scatter=False, y_unit=True)
        pairs = [(r.hit_fraction, r.ttft_s * 1000) for r in reqs if r.hit_fraction is not None]
        self._plot("#scatter-plot", "TTFT (ms) vs prefix-cache hit fraction",
                   [p[0] for p in pairs], [p[1] for p in pairs], scatter=True, x_unit=True)

    def _plot(self, sel: str, title: str, xs: list, ys: list, scatter: bool, y_unit: bool = False,
              x_unit: bool = False) -> None:
        """One plot; a fraction's axis runs from 0 to 1 whatever the data (one point gave -0.33 to 1.00)."""
        w = self.query_one(sel, PlotextPlot)
        plt = w.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title)
        if xs:
            (plt.scatter if scatter else plt.plot)(xs, ys, marker="dot" if scatter else "braille")
        if y_unit:
            plt.ylim(0.0, 1.0)
        if x_unit:
            plt.xlim(0.0, 1.0)
        w.refresh()
