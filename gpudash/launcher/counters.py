"""Prometheus text into flat numbers, and rates from the change of counters between two scrapes.

Every kind reads its /metrics through these, so a rate means the same thing for every kind: the change
of a counter over wall-clock time since the previous scrape of the same server process.

vLLM with data parallelism exports one series per engine (`engine="0"`, `engine="1"`): counters and
request counts add up over engines, fractions (KV-cache usage, sleep state) are averaged; every DP engine
runs the same model on the same kind of GPU, so the plain mean is the capacity-weighted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Labels that only say which model / DP engine (or histogram bucket) a series is; other labels (source, sleep_state,
# reason, ...) get their own key `name{label="value"}` besides the total under `name`.
_UNKEYED_LABELS = frozenset({"model_name", "engine", "le", "quantile"})
# A drafted-token delta is used for acceptance once it spans this many print steps (about 1% error).
WIDEN_STEPS = 100
# Per-engine fractions: averaged over engines, never added up.
MEAN_GAUGES = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:engine_sleep_state"})


def parse_metrics(text: str) -> dict[str, float]:
    """Flat {key: value}: each sample name under `name`, and per extra label under `name{label="value"}`;
    series of several engines are summed, those of MEAN_GAUGES averaged. Histogram buckets also go under
    `name{le="bound"}` (summed over engines), so quantiles can be read from them."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            keys = [s.name] + [f'{s.name}{{{k}="{v}"}}' for k, v in sorted(s.labels.items())
                               if k not in _UNKEYED_LABELS or (k == "le" and s.name.endswith("_bucket"))]
            for key in keys:
                sums[key] = sums.get(key, 0.0) + float(s.value)
                counts[key] = counts.get(key, 0) + 1
    return {k: (v / counts[k] if k.split("{", 1)[0] in MEAN_GAUGES else v) for k, v in sums.items()}


def families(text: str) -> set[str]:
    """The metric family names in a /metrics answer (ValueError when it is not Prometheus text)."""
    return {f.name for f in text_string_to_metric_families(text)}


def first(m: dict[str, float], *names: str) -> float | None:
    """The value of the first name present (current name first, older releases' names after)."""
    return next((m[n] for n in names if n in m), None)


@dataclass(frozen=True)
class Prev:
    """The previous scrape of one server: its process, when, and what it said."""

    pid: int | None
    ts: float
    values: dict[str, float]


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
