"""Autotune: sweep chunk sizes (and staging threads) and find the fallback thresholds for this machine.

With relay paths (multipath possible), the chunk sweep times multipath copies of pinned memory and the
fallback threshold is the smallest size from which multipath beats the single direct path at every
larger size tried. Without relay paths (one GPU, or no P2P), chunking only matters for the staging
ring, so the sweep times staged pageable copies and the fallback thresholds keep their values.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.bench import HUGE, MiB, side_for
from engine.transfer import TransferEngine

CHUNKS = (1 * MiB, 2 * MiB, 2_810_000, 4 * MiB, 5_370_000, 8 * MiB, 16 * MiB)
FALLBACK_SIZES = (1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 11_300_000, 16 * MiB, 32 * MiB, 64 * MiB)
STAGING_THREADS = (4, 8, 12, 16)


@dataclass
class TuneResult:
    knobs: dict[str, int] = field(default_factory=dict)  # values to write into [engine]
    table: list[tuple[str, str, float]] = field(default_factory=list)  # (what, value, GB/s)
    notes: list[str] = field(default_factory=list)


def _rate(eng: TransferEngine, side: Any, fn: Callable[[], Any], n: int, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = side.clock()
        fn()
        times.append(side.clock() - t0)
    return n / statistics.median(times) / 1e9


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
        for direction in ("h2d", "d2h"):
            h2d = direction == "h2d"
            host = pinned if multipath else pageable
            mode = "auto" if multipath else "stage"

            def copy(n: int = size) -> Any:
                return (eng.copy(dev, host, n, pageable=mode) if h2d else eng.copy(host, dev, n, pageable=mode)).wait()

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
            threshold = next((n for i, (n, _w) in enumerate(wins) if all(w for _n, w in wins[i:])), HUGE)
            res.knobs[f"{direction}_fallback_bytes"] = threshold
        if eng.backend == "cuda":  # how many memcpy threads the staging ring needs (both directions)
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
    finally:
        eng.set(**saved)
    return res
