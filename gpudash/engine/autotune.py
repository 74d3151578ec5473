"""Autotune: sweep chunk sizes (and staging threads) and find the fallback thresholds for this machine.

With relay paths (multipath possible), the chunk sweep times multipath copies of pinned memory and the
fallback threshold is the smallest size from which multipath beats the single direct path at every
larger size tried. Without relay paths (one GPU, or no P2P), chunking only matters for the staging
ring, so the sweep times staged pageable copies and the fallback thresholds keep their values.

On the cuda backend it also finds the staging thresholds (`h2d_staging_bytes`, `d2h_staging_bytes`):
one-shot pageable copies through the staging ring against one plain driver copy of the pageable memory,
each on a freshly allocated numpy buffer as a one-shot copy meets it; the threshold is the smallest size
from which staging wins at every larger size tried. The sim does not model the pageable-memory penalty,
so there these thresholds keep their values.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpudash.engine.bench import HUGE, MiB, side_for
from gpudash.engine.transfer import TransferEngine

CHUNKS = (1 * MiB, 2 * MiB, 2_810_000, 4 * MiB, 5_370_000, 8 * MiB, 16 * MiB)
FALLBACK_SIZES = (1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 11_300_000, 16 * MiB, 32 * MiB, 64 * MiB)
STAGING_THREADS = (4, 8, 12, 16)
STAGING_SIZES = (1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB)
STAGING_REPS = 5
SIM_STAGING_NOTE = "the sim does not model the pageable-memory penalty; *_staging_bytes unchanged"


@dataclass
class TuneResult:
    knobs: dict[str, int] = field(default_factory=dict)  # values to write into [engine]
    table: list[tuple[str, str, float]] = field(default_factory=list)  # (what, value, GB/s or a speed ratio)
    notes: list[str] = field(default_factory=list)


def _rate(eng: TransferEngine, side: Any, fn: Callable[[], Any], n: int, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = side.clock()
        fn()
        times.append(side.clock() - t0)
    return n / statistics.median(times) / 1e9


def _threshold(wins: list[tuple[int, bool]]) -> int:
    """The smallest size from which the candidate wins at every larger size tried; HUGE if it never does."""
    return next((n for i, (n, _w) in enumerate(wins) if all(w for _n, w in wins[i:])), HUGE)


def _one_shot_seconds(eng: TransferEngine, side: Any, dev: Any, n: int, h2d: bool, mode: str) -> float:
    """One copy of n bytes between `dev` and a fresh pageable numpy buffer, as a one-shot copy meets it:
    for H2D a filled source (filled before timing), for D2H an untouched destination."""
    if h2d:
        host = np.full(n, 5, np.uint8)
        t0 = side.clock()
        eng.copy(dev, host, n, pageable=mode).wait()
    else:
        host = np.empty(n, np.uint8)
        t0 = side.clock()
        eng.copy(host, dev, n, pageable=mode).wait()
    return side.clock() - t0


def staging_thresholds(eng: TransferEngine, side: Any, dev: Any, size: int, res: TuneResult,
                       progress: Callable[[str], None] | None = None, reps: int = STAGING_REPS) -> None:
    """Per direction, time one-shot pageable copies staged vs one driver copy (interleaved, median of
    `reps`) at STAGING_SIZES up to `size`; record (staged/driver speed ratio) rows and set
    `res.knobs["<dir>_staging_bytes"]`. `dev` must hold at least min(size, 64 MiB) bytes."""
    sizes = [n for n in STAGING_SIZES if n <= size]
    if not sizes:
        res.notes.append(f"tune size {size} is below {STAGING_SIZES[0]} bytes; *_staging_bytes unchanged")
        return
    for direction in ("h2d", "d2h"):
        h2d = direction == "h2d"
        for mode in ("stage", "driver"):  # untimed warm-up: first-use costs stay out of the first size
            _one_shot_seconds(eng, side, dev, sizes[0], h2d, mode)
        wins = []
        for n in sizes:
            if progress:
                progress(f"{direction} staging {n}")
            times: dict[str, list[float]] = {"stage": [], "driver": []}
            for rep in range(reps):  # interleaved, alternating which goes first
                for mode in (("stage", "driver") if rep % 2 == 0 else ("driver", "stage")):
                    times[mode].append(_one_shot_seconds(eng, side, dev, n, h2d, mode))
            staged, driver = statistics.median(times["stage"]), statistics.median(times["driver"])
            res.table.append((f"{direction} staged/driver", str(n), driver / staged if staged > 0 else float("inf")))
            wins.append((n, staged <= driver))
        res.knobs[f"{direction}_staging_bytes"] = _threshold(wins)


def tune(eng: TransferEngine, size: int = 256 * MiB, progress: Callable[[str], None] | None = None) -> TuneResult:
    """Measure on GPU 0 and return the best knobs; the engine's knobs are restored afterwards."""
    saved = eng.knobs()
    side = side_for(eng)
    res = TuneResult()
    multipath = any(p.via is not None for p in eng.stats().paths if p.gpu == 0)
    dev = side.device(size)
    pinned = side.pinned(size)
    pageable = np.full(size, 5, dtype=np.uint8)
    try:
        if eng.backend == "cuda":  # first, how many memcpy threads the staging ring needs (both directions)
            best_t = (0.0, saved["staging_threads"])
            for threads in STAGING_THREADS:
                if progress:
                    progress(f"staging threads {threads}")
                eng.set(staging_threads=threads)
                up = _rate(eng, side, lambda: eng.copy(dev, pageable, pageable="stage").wait(), size)
                down = _rate(eng, side, lambda: eng.copy(np.empty(size, np.uint8), dev, pageable="stage").wait(), size)
                res.table.append(("h2d staged threads", str(threads), up))
                res.table.append(("d2h staged threads", str(threads), down))
                best_t = max(best_t, (up + down, threads))
            res.knobs["staging_threads"] = best_t[1]
            eng.set(staging_threads=best_t[1])
        for direction in ("h2d", "d2h"):
            h2d = direction == "h2d"
            host = pinned if multipath else pageable
            mode = "auto" if multipath else "stage"

            def copy(n: int = size) -> Any:
                if h2d:
                    return eng.copy(dev, host, n, pageable=mode).wait()
                # staged D2H serves one-shot destinations: time it into fresh memory, as it meets them
                return eng.copy(host if multipath else np.empty(n, np.uint8), dev, n, pageable=mode).wait()

            best = (0.0, saved[f"{direction}_chunk_bytes"])
            eng.set(**{f"{direction}_fallback_bytes": 0})
            for chunk in CHUNKS:
                if progress:
                    progress(f"{direction} chunk {chunk}")
                eng.set(**{f"{direction}_chunk_bytes": chunk})
                r = _rate(eng, side, copy, size)
                res.table.append((f"{direction} chunk", str(chunk), r))
                best = max(best, (r, chunk))
            res.knobs[f"{direction}_chunk_bytes"] = best[1]
            eng.set(**{f"{direction}_chunk_bytes": best[1]})
            if not multipath:
                res.notes.append(f"{direction}: no relay paths on this machine; {direction}_fallback_bytes unchanged "
                                 f"and chunk size tuned for the staging ring (pageable copies)")
                continue
            wins = []
            for n in (n for n in FALLBACK_SIZES if n <= size):
                if progress:
                    progress(f"{direction} fallback {n}")
                eng.set(**{f"{direction}_fallback_bytes": 0})
                multi = _rate(eng, side, lambda: copy(n), n, reps=5)
                eng.set(**{f"{direction}_fallback_bytes": HUGE})
                single = _rate(eng, side, lambda: copy(n), n, reps=5)
                res.table.append((f"{direction} multipath/single", str(n), multi / single))
                wins.append((n, multi >= single))
            res.knobs[f"{direction}_fallback_bytes"] = _threshold(wins)
        if eng.backend == "cuda":
            eng.set(**res.knobs)  # the thresholds are measured with the knobs just tuned
            staging_thresholds(eng, side, dev, size, res, progress)
        else:
            res.notes.append(SIM_STAGING_NOTE)
    finally:
        eng.set(**saved)
    return res
