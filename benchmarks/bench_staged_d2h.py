"""llama-server's prompt-cache save, reproduced with the engine alone: the device-to-host copies of
pageable memory that issue 11's llama-server figure counts, native and through the staging ring, in
one run, side by side.

llama.cpp saves an evicted slot's KV state with one synchronous copy per tensor (ggml-cuda:
cudaMemcpyAsync then a stream sync) into a host buffer it has just zero-filled, so the destination is
pageable and already faulted: 64 copies of about 32 MiB for a 16k-token prompt of an 8B-shape model.
numpy asks for huge pages on large arrays, where llama.cpp's std::vector gets 4 KiB pages, so that
case runs twice. PyTorch's `.cpu()` copies into fresh memory instead, which the kernel still has to
fault. Each case runs
`--copies` copies of `--mib` MiB from one device buffer, native (one driver copy and a stream sync:
pageable="driver") and through the engine's staging ring (pageable="stage"), the two taking turns in
`--rounds` rounds; the table gives the medians of the rounds' totals and the ratio. A last line gives
the floor: the same copies into pinned memory (no staging), which the staging ring can approach.

Run: python benchmarks/bench_staged_d2h.py [--backend cuda] [--copies 64] [--mib 32] [--set knob=value]
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import time
from collections.abc import Callable

import numpy as np

from gpudash.engine import EngineConfig, TransferEngine

MiB = 2**20


def _total_s(eng: TransferEngine, host: np.ndarray, dev_ptr: int, copies: int, size: int, pageable: str) -> float:
    """Seconds for `copies` synchronous D2H copies of `size` bytes into consecutive pieces of host."""
    t0 = time.perf_counter()
    for i in range(copies):
        eng.copy(host[i * size:(i + 1) * size], dev_ptr + i * size, nbytes=size, pageable=pageable, sync=True)
    return time.perf_counter() - t0


def _small_pages(nbytes: int) -> np.ndarray:
    """Anonymous memory on 4 KiB pages, written once: what glibc's malloc gives a large std::vector
    under the usual transparent-huge-page setting ("madvise"), which llama.cpp then zero-fills."""
    mem = mmap.mmap(-1, nbytes)
    mem.madvise(mmap.MADV_NOHUGEPAGE)
    arr = np.frombuffer(mem, dtype=np.uint8)  # keeps the mapping alive
    arr[:] = 1
    return arr


# The destinations: (name, whether each round gets a fresh buffer, how a buffer of n bytes is made).
DESTINATIONS: tuple[tuple[str, bool, Callable[[int], np.ndarray]], ...] = (
    ("faulted pageable, huge pages (numpy)", False, lambda n: np.ones(n, dtype=np.uint8)),
    ("faulted pageable, 4 KiB pages (llama.cpp)", False, _small_pages),
    ("fresh pageable (PyTorch .cpu())", True, lambda n: np.empty(n, dtype=np.uint8)),
)


def _case(eng: TransferEngine, dev_ptr: int, copies: int, size: int, rounds: int,
          make: Callable[[int], np.ndarray], fresh: bool) -> dict[str, float]:
    """Median total seconds of native and staged, taking turns; each round gets a new host buffer when
    `fresh` (unfaulted, as PyTorch's .cpu() allocates), else reuses one faulted buffer (as llama.cpp's
    zero-filled state buffer is)."""
    kept = None if fresh else make(copies * size)
    times: dict[str, list[float]] = {"driver": [], "stage": []}
    for r in range(rounds + 1):  # round 0 warms both up and is not counted
        for mode in times:
            host = make(copies * size) if kept is None else kept
            took = _total_s(eng, host, dev_ptr, copies, size, mode)
            if r:
                times[mode].append(took)
    return {mode: statistics.median(t) for mode, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cuda", "sim"], default="cuda")
    ap.add_argument("--copies", type=int, default=64)
    ap.add_argument("--mib", type=float, default=32.0, help="MiB per copy")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], help="knob=value applied before the bench")
    args = ap.parse_args(argv)
    size = int(args.mib * MiB)
    with TransferEngine(EngineConfig(backend=args.backend)) as eng:
        if args.set:
            eng.set(**{k: int(v) for k, v in (s.split("=", 1) for s in args.set)})
        knobs = eng.knobs()
        dev = eng.alloc_device(0, args.copies * size)
        print(f"{args.copies} synchronous D2H copies of {args.mib:g} MiB ({args.copies * size / 1e9:.2f} GB) per "
              f"round, {args.rounds} rounds, medians; backend {eng.backend}; staging_threads "
              f"{knobs['staging_threads']}, d2h_chunk_bytes {knobs['d2h_chunk_bytes']}")
        print(f"{'destination':<44}{'native s':>10}{'engine s':>10}{'ratio':>8}{'native GB/s':>13}{'engine GB/s':>13}")
        for name, fresh, make in DESTINATIONS:
            t = _case(eng, dev.ptr, args.copies, size, args.rounds, make, fresh)
            gb = args.copies * size / 1e9
            print(f"{name:<44}{t['driver']:>10.4f}{t['stage']:>10.4f}{t['driver'] / t['stage']:>7.2f}x"
                  f"{gb / t['driver']:>13.2f}{gb / t['stage']:>13.2f}")
        pinned = eng.alloc_host(args.copies * size)
        floor = statistics.median(_total_s(eng, pinned.array(), dev.ptr, args.copies, size, "driver")
                                  for _ in range(args.rounds + 1))
        print(f"floor: into pinned memory, one driver copy each: {floor:.4f} s, "
              f"{args.copies * size / 1e9 / floor:.2f} GB/s")
        pinned.free()
        dev.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
