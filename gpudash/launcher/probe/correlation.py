"""How TTFT moves with the prefix-cache hit fraction: Pearson and Spearman over probe requests.

Computed here (numpy only) so the TUI, `gpudash probe` and exports show the same numbers. A strong
negative correlation means the cache is doing its job: the more of a prompt is cached, the sooner
the first token arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpudash.records import RequestSample

MIN_POINTS = 3


@dataclass(frozen=True)
class Correlation:
    """Coefficients in [-1, 1], None when fewer than MIN_POINTS usable requests or a constant side."""

    pearson: float | None
    spearman: float | None
    n: int


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (what Spearman's rho needs)."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    ranks[order] = np.arange(1, len(x) + 1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    dx, dy = x - x.mean(), y - y.mean()
    denom = float(np.sqrt((dx * dx).sum() * (dy * dy).sum()))
    if denom == 0.0:
        return None
    return float(np.clip((dx * dy).sum() / denom, -1.0, 1.0))


def pairs(requests: Iterable[RequestSample]) -> tuple[np.ndarray, np.ndarray]:
    """(hit fraction, TTFT seconds) of the successful requests that know both."""
    pts = [(r.hit_fraction, r.ttft_s) for r in requests if r.ok and r.ttft_s is not None and r.hit_fraction is not None]
    if not pts:
        return np.empty(0), np.empty(0)
    arr = np.asarray(pts, dtype=float)
    return arr[:, 0], arr[:, 1]


def ttft_hit_correlation(requests: Iterable[RequestSample]) -> Correlation:
    """Pearson and Spearman correlation of TTFT with the hit fraction over `requests`."""
    hit, ttft = pairs(requests)
    n = len(hit)
    if n < MIN_POINTS:
        return Correlation(None, None, n)
    return Correlation(_pearson(hit, ttft), _pearson(_ranks(hit), _ranks(ttft)), n)


def windowed(requests: Sequence[RequestSample], window_s: float) -> list[tuple[float, Correlation]]:
    """(window start, correlation) per `window_s`-second window of request timestamps, oldest first."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    if not requests:
        return []
    t0 = min(r.ts for r in requests)
    buckets: dict[int, list[RequestSample]] = {}
    for r in requests:
        buckets.setdefault(int((r.ts - t0) // window_s), []).append(r)
    return [(t0 + k * window_s, ttft_hit_correlation(buckets[k])) for k in sorted(buckets)]


@dataclass(frozen=True)
class ProbeSummary:
    """What `gpudash probe` prints: TTFT overall and split into cache hits and misses, plus the correlation."""

    requests: int
    failed: int
    ttft_median_ms: float | None
    ttft_p90_ms: float | None
    hit_ttft_median_ms: float | None
    miss_ttft_median_ms: float | None
    hits: int
    misses: int
    mean_hit_fraction: float | None
    server_prompt_median_ms: float | None
    correlation: Correlation
    last_error: str | None = None  # the newest failed request's error: failures never read as missing data


# A request counts as a cache hit when at least this share of its prompt came from the cache.
HIT_THRESHOLD = 0.5


def _median_ms(xs: list[float]) -> float | None:
    return float(np.median(xs)) * 1000.0 if xs else None


def summarize(requests: Sequence[RequestSample]) -> ProbeSummary:
    ok = [r for r in requests if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    hits = [r for r in ok if r.hit_fraction is not None and r.hit_fraction >= HIT_THRESHOLD]
    misses = [r for r in ok if r.hit_fraction is not None and r.hit_fraction < HIT_THRESHOLD]
    fractions = [r.hit_fraction for r in ok if r.hit_fraction is not None]
    prompt_ms = [r.server_prompt_ms / 1000.0 for r in ok if r.server_prompt_ms is not None]
    return ProbeSummary(
        requests=len(requests), failed=len(requests) - len(ok),
        ttft_median_ms=_median_ms(ttfts),
        ttft_p90_ms=float(np.percentile(ttfts, 90)) * 1000.0 if ttfts else None,
        hit_ttft_median_ms=_median_ms([r.ttft_s for r in hits if r.ttft_s is not None]),
        miss_ttft_median_ms=_median_ms([r.ttft_s for r in misses if r.ttft_s is not None]),
        hits=len(hits), misses=len(misses),
        mean_hit_fraction=float(np.mean(fractions)) if fractions else None,
        server_prompt_median_ms=_median_ms(prompt_ms),
        correlation=ttft_hit_correlation(requests),
        last_error=next((r.error for r in reversed(requests) if not r.ok), None),
    )
