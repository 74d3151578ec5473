"""Prometheus text into flat numbers, and rates from the change of counters between two scrapes.

Every kind reads its /metrics through these, so a rate means the same thing for every kind: the change
of a counter over wall-clock time since the previous scrape of the same server process, and a histogram's
quantiles over the last WINDOW_S of scrapes (a server's own TTFT observed in one 1 s interval is there in
one tick of six; over a minute it is there for whoever looks).

Only the families a kind reads are parsed (`wanted`): an exporter beside the server, or a server with a
label of high cardinality, can put 150 000 series on one /metrics, and parsing them all took most of a
core. What is kept is capped at MAX_SERIES series.

vLLM with data parallelism exports one series per engine (`engine="0"`, `engine="1"`): counters and
request counts add up over engines; KV-cache usage is the fullest engine's (a full engine must not hide
under the mean of the others), each engine's under `name{engine="i"}` too; the sleep state is averaged.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Labels that only say which model / DP engine (or histogram bucket) a series is; other labels (source, sleep_state,
# reason, ...) get their own key `name{label="value"}` besides the total under `name`.
_UNKEYED_LABELS = frozenset({"model_name", "engine", "le", "quantile"})
# A drafted-token delta is used for acceptance once it spans this many print steps (about 1% error).
WIDEN_STEPS = 100
# Per-engine fractions: averaged over engines, never added up.
MEAN_GAUGES = frozenset({"vllm:engine_sleep_state"})
# Per-engine fractions whose fullest engine is the figure (each engine's is kept under name{engine="i"}).
MAX_GAUGES = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"})
# Series of the wanted families kept from one answer; past it the answer is refused, not half read.
MAX_SERIES = 20_000
# How far back the windowed figures (histogram quantiles, means, hit rates) look.
WINDOW_S = 60.0
# How far back token rates look: several of llama-server's updates (it advances its counts once per batch,
# 2048 prompt tokens took 2.9 s on a CPU), so a steady prefill does not read 0, 0, 1864, 0.
RATE_WINDOW_S = 10.0
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info")


def wanted_text(text: str, families: Collection[str]) -> str:
    """The lines of a /metrics answer that belong to `families` (names or prefixes ending in ':'): their
    samples and HELP/TYPE lines, found by one regular-expression scan instead of parsing every series.
    ValueError when more than MAX_SERIES samples remain."""
    names = "|".join(re.escape(f) + ("" if f.endswith(":") else r"(?:" + "|".join(_SUFFIXES) + r")?(?=[\s{])")
                     for f in sorted(families))
    lines = re.findall(rf"^(?:# (?:HELP|TYPE) )?(?:{names})[^\n]*$", text, re.M)
    samples = sum(1 for line in lines if not line.startswith("#"))
    if samples > MAX_SERIES:
        raise ValueError(f"its /metrics has {samples} series of the families gpudash reads, over the {MAX_SERIES} "
                         "it parses in one tick")
    return "\n".join(lines) + "\n"


def parse_metrics(text: str, families: Collection[str] | None = None) -> dict[str, float]:
    """Flat {key: value}: each sample name under `name`, and per extra label under `name{label="value"}`;
    series of several engines are summed, MEAN_GAUGES averaged, MAX_GAUGES the largest (each engine's under
    `name{engine="i"}`). Histogram buckets also go under `name{le="bound"}` (summed over engines), so
    quantiles can be read from them. An info family's numeric labels go under `name.label` (summed over
    engines, whose number is `name.count`). `families`: parse only those (see wanted_text)."""
    if families is not None:
        text = wanted_text(text, families)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if name.endswith("_info"):  # one series per engine: `name.count` says how many
                sums[f"{name}.count"] = sums.get(f"{name}.count", 0.0) + 1
                for label, v in s.labels.items():
                    try:
                        sums[f"{name}.{label}"] = sums.get(f"{name}.{label}", 0.0) + float(v)
                    except ValueError:
                        continue
                continue
            keys = [name] + [f'{name}{{{k}="{v}"}}' for k, v in sorted(s.labels.items())
                             if k not in _UNKEYED_LABELS or (k == "le" and name.endswith("_bucket"))]
            value = float(s.value)
            if name in MAX_GAUGES:
                sums[f'{name}{{engine="{s.labels.get("engine", "0")}"}}'] = value
                sums[name] = max(sums.get(name, value), value)
                continue
            for key in keys:
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
    return {k: (v / counts[k] if k.split("{", 1)[0] in MEAN_GAUGES else v) for k, v in sums.items()}


def per_engine(m: dict[str, float], name: str) -> tuple[float, ...] | None:
    """Each DP engine's value of a MAX_GAUGES family, by engine number (None with one engine or none)."""
    prefix = f'{name}{{engine="'
    found = sorted((int(k[len(prefix):-2]), v) for k, v in m.items() if k.startswith(prefix) and k[len(prefix):-2].isdigit())
    return tuple(v for _, v in found) if len(found) > 1 else None


def speaks(text: str, prefix: str) -> bool:
    """Whether a /metrics answer has a family whose name starts with `prefix` (one scan, no parse)."""
    return re.search(rf"^(?:# (?:HELP|TYPE) )?{re.escape(prefix)}", text, re.M) is not None


def first(m: dict[str, float], *names: str) -> float | None:
    """The value of the first name present (current name first, older releases' names after)."""
    return next((m[n] for n in names if n in m), None)


@dataclass(frozen=True)
class Prev:
    """The previous scrape of one server: its process, when, and what it said."""

    pid: int | None
    ts: float
    values: dict[str, float]


class History:
    """The scrapes of one server process over the last WINDOW_S (and the one just before): `last` for the
    per-tick rates, `start` for the figures kept over the window. A new process starts it afresh."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._scrapes: deque[Prev] = deque()
        self.facts: dict[str, Any] = {}  # what a kind keeps about the process between scrapes

    def add(self, scrape: Prev) -> None:
        if self._scrapes and self._scrapes[-1].pid != scrape.pid:
            self.clear()
        self._scrapes.append(scrape)
        while len(self._scrapes) > 2 and self._scrapes[1].ts <= scrape.ts - self.window_s:
            self._scrapes.popleft()

    def clear(self) -> None:
        self._scrapes.clear()
        self.facts.clear()

    def since(self, now: float, span: float = RATE_WINDOW_S) -> Prev | None:
        """The latest scrape at least `span` seconds before `now` (the oldest kept when none is that old):
        where a rate over the last `span` seconds starts."""
        found = None
        for scrape in self._scrapes:
            if scrape.ts > now - span:
                break
            found = scrape
        return found if found is not None else self.start

    @property
    def last(self) -> Prev | None:
        return self._scrapes[-1] if self._scrapes else None

    @property
    def start(self) -> Prev | None:
        return self._scrapes[0] if self._scrapes else None


def delta(cur: dict[str, float], prev: Prev | None, pid: int | None, name: str) -> float | None:
    """How much counter `name` grew since `prev`; None when unknown (no previous scrape, another process,
    or a counter that went down: the process restarted)."""
    if prev is None or prev.pid != pid or name not in cur or name not in prev.values:
        return None
    d = cur[name] - prev.values[name]
    return d if d >= 0 else None


def rate(m: dict[str, float], prev: Prev | None, pid: int | None, now: float, name: str) -> float | None:
    """Counter `name`'s growth per second of wall-clock time since `prev`."""
    d = delta(m, prev, pid, name)
    dt = (now - prev.ts) if prev is not None else 0.0
    return d / dt if d is not None and dt > 0 else None


def share(m: dict[str, float], base: Prev | None, pid: int | None, hits: str, *queries: str) -> float | None:
    """How much counter `hits` grew since `base` over the growth of the `queries` counters together (a hit
    rate over the window, not since the server started); None when nothing was queried."""
    got = delta(m, base, pid, hits)
    asked = [delta(m, base, pid, q) for q in queries]
    if got is None or any(a is None for a in asked):
        return None
    total = sum(asked)  # type: ignore[arg-type]
    return min(1.0, got / total) if total > 0 else None


def printed_step(value: float) -> float:
    """The resolution of a counter printed with C's %g (6 significant digits, as llama-server prints its
    metrics): 0 below 10**6, where it is exact; 10 from 10**6, 100 from 10**7, ..."""
    return 0.0 if abs(value) < 1e6 else 10.0 ** (math.floor(math.log10(abs(value))) - 5)


def acceptance(m: dict[str, float], prev: Prev | None, pid: int | None, drafted: str, accepted: str) -> float | None:
    """Accepted / drafted tokens since the last scrape, within [0, 1]; None when nothing was drafted.

    Counters printed with %g (printed_step) move in steps: over a short interval their deltas can be
    mostly rounding (a pair gives 2.0 where the truth is 0.857). The interval is then widened: the
    start values stay in `m` under `name@start` (the next scrape's `prev`) until the drafted delta is at
    least WIDEN_STEPS steps, so the figure is never off by more than about 1 / WIDEN_STEPS; until then
    it is unknown (None), never wrong."""
    if prev is None or prev.pid != pid or drafted not in m or accepted not in m:
        return None
    start_d = prev.values.get(f"{drafted}@start", prev.values.get(drafted))
    start_a = prev.values.get(f"{accepted}@start", prev.values.get(accepted))
    if start_d is None or start_a is None:
        return None
    d, a = m[drafted] - start_d, m[accepted] - start_a
    if d < 0 or a < 0 or d == 0:  # restarted, or nothing drafted: measure from here
        return None
    step = max(printed_step(m[drafted]), printed_step(m[accepted]))
    if step and d < WIDEN_STEPS * step:
        m[f"{drafted}@start"], m[f"{accepted}@start"] = start_d, start_a
        return None
    return min(1.0, max(0.0, a / d))


def quantiles(m: dict[str, float], prev: Prev | None, pid: int | None, family: str,
              qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[float, float] | None:
    """Quantiles of the observations a histogram got since the last scrape, from the change of its
    cumulative buckets (`family_bucket{le="..."}`), interpolated linearly within a bucket as Prometheus'
    histogram_quantile does; a quantile in the +Inf bucket is the highest finite bound. None when the
    histogram is absent or nothing was observed in the interval."""
    if prev is None or prev.pid != pid:
        return None
    prefix = f'{family}_bucket{{le="'
    bounds = []
    for key in m:
        if key.startswith(prefix) and key in prev.values:
            le = float(key[len(prefix):-2])
            bounds.append((le, m[key] - prev.values[key]))
    bounds.sort()
    if not bounds or bounds[-1][1] <= 0 or any(c < 0 for _, c in bounds):
        return None
    total = bounds[-1][1]
    out = {}
    for q in qs:
        rank = q * total
        lo_bound, lo_count = 0.0, 0.0
        for le, count in bounds:
            if count >= rank:
                if math.isinf(le):
                    out[q] = lo_bound
                else:
                    span = count - lo_count
                    out[q] = lo_bound + (le - lo_bound) * ((rank - lo_count) / span if span > 0 else 1.0)
                break
            lo_bound, lo_count = le, count
    return out


def windowed_mean(m: dict[str, float], base: Prev | None, pid: int | None, family: str) -> float | None:
    """The mean observation of histogram `family` since `base` (its _sum's change over its _count's)."""
    n = delta(m, base, pid, f"{family}_count")
    total = delta(m, base, pid, f"{family}_sum")
    return total / n if n and total is not None else None


def buckets(m: dict[str, float], family: str) -> tuple[tuple[str, float], ...] | None:
    """A histogram's cumulative buckets as the server counts them, ((le, count), ...) by bound, for
    exporting it again as a histogram; None when the server has no such histogram."""
    prefix = f'{family}_bucket{{le="'
    found = [(k[len(prefix):-2], v) for k, v in m.items() if k.startswith(prefix)]
    return tuple(sorted(found, key=lambda b: float(b[0]))) if found else None
