"""Where the time of a small synchronous pinned copy goes: the engine's layers against CuPy's native
copy on the same buffers, in microseconds per copy (median of many), with the ratio to native.

Rows, from the bottom up: the two driver calls through ctypes (the floor any ctypes caller pays), the
engine's C entry point through ctypes (its scheduler's fast path), and the Python API as users call
it. Needs CuPy and an NVIDIA GPU. Run: python benchmarks/bench_copy_overhead.py [--reps N]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from collections.abc import Callable

import numpy as np

from gpudash.engine import TransferEngine
from gpudash.engine import _native as N

SIZES = (4096, 64 * 1024, 1 << 20)


def medians_us(rows: dict[str, Callable[[], object]], reps: int, rounds: int = 10) -> dict[str, float]:
    """Median microseconds per call of each row, the rows taking turns in `rounds` rounds (a machine's
    speed drifts over seconds; interleaving makes the drift hit every row alike)."""
    times: dict[str, list[int]] = {name: [] for name in rows}
    for name, fn in rows.items():  # warm-up
        for _ in range(reps // 10):
            fn()
    for _ in range(rounds):
        for name, fn in rows.items():
            for _ in range(reps // rounds):
                t0 = time.perf_counter_ns()
                fn()
                times[name].append(time.perf_counter_ns() - t0)
    return {name: statistics.median(t) / 1e3 for name, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3000)
    args = ap.parse_args()
    import cupy as cp
    import cupyx

    libcuda = ctypes.CDLL("libcuda.so.1")
    memcpy = libcuda.cuMemcpyHtoDAsync_v2
    memcpy.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    sync = libcuda.cuStreamSynchronize
    sync.argtypes = [ctypes.c_void_p]
    stream = cp.cuda.Stream(non_blocking=True)
    results: dict[str, list[float]] = {}
    with TransferEngine(backend="cuda") as eng:
        lib = N.lib()
        out = (ctypes.c_uint64 * 2)()
        for n in SIZES:
            dev = cp.empty(n, dtype=cp.uint8)
            host = cupyx.empty_pinned((n,), dtype=np.uint8)
            host[:] = 1
            reused = np.ones(n, dtype=np.uint8)
            for _ in range(2):  # second sight: registered from now on
                eng.copy(dev, reused).wait()
            dptr, hptr = dev.data.ptr, host.ctypes.data
            desc = N.CopyDescC(N.H2D, 0, dptr, hptr, n)
            rows: dict[str, Callable[[], object]] = {
                "native: CuPy memcpyAsync + synchronize (the bench's baseline)": lambda: (
                    cp.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, n, 1, stream.ptr),
                    stream.synchronize()),
                "floor: cuMemcpyHtoDAsync + cuStreamSynchronize via ctypes": lambda: (
                    memcpy(dptr, hptr, n, stream.ptr), sync(stream.ptr)),
                "engine C: ge_copy_sync via ctypes (fast path)": lambda: lib.ge_copy_sync(
                    eng._ptr, desc, N.HOST_DIRECT, 0, out),
                "engine: copy(cupy, pinned numpy, sync=True).wait()": lambda: eng.copy(dev, host, sync=True).wait(),
                "engine: copy(cupy, reused pageable, sync=True).wait()": lambda: eng.copy(dev, reused, sync=True).wait(),
                "engine: copy(cupy, pinned numpy).wait() (async API)": lambda: eng.copy(dev, host).wait(),
            }
            for name, us in medians_us(rows, args.reps).items():
                results.setdefault(name, []).append(us)
    native = results["native: CuPy memcpyAsync + synchronize (the bench's baseline)"]
    head = f"{'H2D, synchronous, median us per copy':58s}" + "".join(f"{_size(n):>17s}" for n in SIZES)
    print(f"{args.reps} copies per cell, rows interleaved in 10 rounds; ratio = native time / this time (>1: faster)")
    print(head)
    print("-" * len(head))
    for name, us in results.items():
        cells = "".join(f"{t:9.2f} ({b / t:4.2f}x)" for t, b in zip(us, native))
        print(f"{name:58s}{cells}")
    return 0


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


if __name__ == "__main__":
    raise SystemExit(main())
