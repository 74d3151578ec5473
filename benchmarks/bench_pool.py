"""Sharded pool vs a baseline allocator on one recorded KV-cache trace: ops/s and fragmentation.

The trace (engine.traces.kv_tenant_trace: four tenants with 0.5B/7B/32B/7B KV shapes, caches of
1..64 blocks of 16 tokens freed in random order) is recorded to an .npz once and every allocator
replays exactly that file. Allocators:

- gpudash pool, native replay: MemoryPool.replay(), the loop runs in C++ (no Python per op), with the
  default policy "banded" (lowest address among blocks up to 4x the request, else best fit).
- gpudash pool, best fit: the same with policy="best" (the smallest block that fits).
- gpudash pool, Python calls: MemoryPool.alloc()/free() per op through ctypes (same loop as the baseline).
- gpudash pool, shard per tenant: native replay with each tenant in its own shard of capacity/4.
- baseline: CuPy's MemoryPool (unlimited: it grows by cudaMalloc) when CuPy and a GPU are present;
  otherwise a first-fit free-list allocator in pure Python over one arena (labelled as such).

Fragmentation = 1 - largest_free / free, sampled every --sample ops at the same op indices for every
allocator (for CuPy: over the memory its pool has reserved from cudaMalloc; the largest free block is
the largest gap between live allocations inside one reserved chunk). Peak and mean over the samples.

Run: python benchmarks/bench_pool.py [--ops 400000] [--sample 1000] [--trace PATH]
"""

from __future__ import annotations

import argparse
import bisect
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpudash.engine.pools import MemoryPool, PoolExhaustedError
from gpudash.engine.traces import Trace, kv_tenant_trace

CAPACITY_PER_TENANT = 512 << 20


def frag(free: int, largest: int) -> float:
    return 1.0 - largest / free if free else 0.0


class FirstFit:
    """Python baseline: first-fit over an address-sorted free list, neighbours merged on free."""

    name = "first-fit list (pure Python)"

    def __init__(self, capacity: int, granule: int = 256):
        self.g = granule
        self.starts = [0]
        self.sizes = [capacity]
        self.live: dict[int, int] = {}

    def alloc(self, n: int) -> int | None:
        n = -(-n // self.g) * self.g
        for i, sz in enumerate(self.sizes):
            if sz >= n:
                at = self.starts[i]
                if sz == n:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += n
                    self.sizes[i] -= n
                self.live[at] = n
                return at
        return None

    def free(self, at: int) -> None:
        n = self.live.pop(at)
        i = bisect.bisect(self.starts, at)
        if i < len(self.starts) and at + n == self.starts[i]:
            n += self.sizes[i]
            del self.starts[i], self.sizes[i]
        if i and self.starts[i - 1] + self.sizes[i - 1] == at:
            self.sizes[i - 1] += n
        else:
            self.starts.insert(i, at)
            self.sizes.insert(i, n)

    def fragmentation(self) -> float:
        return frag(sum(self.sizes), max(self.sizes, default=0))


class CupyPool:
    """CuPy's MemoryPool with a recording allocator, so its reserved chunks are known."""

    name = "CuPy MemoryPool"

    def __init__(self, capacity: int):
        import cupy

        self.cupy = cupy
        self.chunks: list[tuple[int, int]] = []

        def raw(size: int):  # what the pool asks cudaMalloc for
            mem = cupy.cuda.memory.Memory(size)
            self.chunks.append((mem.ptr, size))
            return cupy.cuda.memory.MemoryPointer(mem, 0)

        # No set_limit: at the limit CuPy frees its cached chunks and retries, which would make the
        # recorded chunk list stale. Unlimited, it only ever grows; its peak reservation is printed.
        self.pool = cupy.cuda.MemoryPool(raw)
        self.live: dict[int, object] = {}
        self.capacity = capacity

    def alloc(self, n: int) -> int | None:
        try:
            p = self.pool.malloc(n)
        except self.cupy.cuda.memory.OutOfMemoryError:
            return None
        self.live[p.ptr] = p
        return p.ptr

    def free(self, at: int) -> None:
        del self.live[at]

    def fragmentation(self) -> float:
        # a pooled allocation's mem is CuPy's PooledMemory: its size is the chunk the pool split off
        spans = sorted((p.ptr, p.ptr + p.mem.size) for p in self.live.values())  # type: ignore[attr-defined]
        starts = [s for s, _ in spans]
        free = largest = 0
        for base, size in self.chunks:
            at, end = base, base + size
            i = bisect.bisect_left(starts, base)
            while i < len(spans) and spans[i][0] < end:
                gap = spans[i][0] - at
                free, largest = free + gap, max(largest, gap)
                at = spans[i][1]
                i += 1
            free, largest = free + end - at, max(largest, end - at)
        return frag(free, largest)

    def reserved(self) -> int:
        return sum(size for _, size in self.chunks)

    def close(self) -> None:
        self.live.clear()
        self.pool.free_all_blocks()


def python_replay(trace: Trace, alloc: Callable[[int, int], int | None], free: Callable[[int], None],
                  sample: int, fragmentation: Callable[[], float] | None) -> dict:
    """Replay in a Python loop; timed without sampling, then once more (untimed) with sampling."""
    ops, shards, sizes, slots = trace.op.tolist(), trace.shard.tolist(), trace.size.tolist(), trace.slot.tolist()

    def run(with_samples: bool) -> tuple[float, int, list[float]]:
        live: dict[int, int] = {}
        fails, samples = 0, []
        gc.disable()
        t0 = time.perf_counter()
        for i, op in enumerate(ops):
            if op == 0:
                at = alloc(shards[i], sizes[i])
                if at is None:
                    fails += 1
                else:
                    live[slots[i]] = at
            else:
                at = live.pop(slots[i], None)
                if at is not None:
                    free(at)
            if with_samples and (i + 1) % sample == 0:
                samples.append(fragmentation())
        dt = time.perf_counter() - t0
        gc.enable()
        for at in live.values():
            free(at)
        return dt, fails, samples

    dt, fails, _ = run(False)
    _, _, samples = run(True) if fragmentation else (0, 0, [])
    return {"ops_s": len(ops) / dt, "fails": fails, "peak": max(samples, default=float("nan")),
            "mean": float(np.mean(samples)) if samples else float("nan")}


def native_row(trace: Trace, shards: dict[str, int], mapping: Trace, sample: int, policy: str = "banded") -> dict:
    with MemoryPool(sum(shards.values()), shards=shards, policy=policy) as pool:
        timed = min((pool.replay(mapping) for _ in range(3)), key=lambda r: r.seconds)
        sampled = pool.replay(mapping, sample_every=sample)
    return {"ops_s": timed.ops_per_s, "fails": timed.failures, "peak": sampled.peak_fragmentation,
            "mean": sampled.mean_fragmentation}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=400_000)
    ap.add_argument("--sample", type=int, default=1000, help="ops between fragmentation samples")
    ap.add_argument("--trace", type=Path, help="replay this recorded .npz instead of recording one")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    path = args.trace or Path(tempfile.gettempdir()) / f"gpudash-kv-trace-{args.ops}-{args.seed}.npz"
    if not path.exists():
        kv_tenant_trace(args.ops, capacity=CAPACITY_PER_TENANT, seed=args.seed).save(path)
    trace = Trace.load(path)
    total = sum(trace.capacity.values())
    one = Trace(trace.op, np.zeros_like(trace.shard), trace.size, trace.slot, ("all",), {"all": total})
    print(f"trace {path}: {len(trace)} ops ({int((trace.op == 0).sum())} allocs), tenants "
          f"{', '.join(trace.shards)}, {total >> 20} MiB in all; fragmentation sampled every {args.sample} ops")

    rows: list[tuple[str, str, dict]] = []
    rows.append(("gpudash pool (one shard)", "native replay", native_row(trace, {"all": total}, one, args.sample)))
    rows.append(("gpudash pool (one shard, best fit)", "native replay",
                 native_row(trace, {"all": total}, one, args.sample, "best")))
    rows.append(("gpudash pool (shard per tenant)", "native replay",
                 native_row(trace, dict(trace.capacity), trace, args.sample)))
    with MemoryPool(total, shards={"all": total}) as pool:
        def p_alloc(_: int, n: int) -> int | None:
            try:
                return pool.alloc("all", n).ptr
            except PoolExhaustedError:
                return None

        def p_frag() -> float:
            return pool.shard_stats("all").fragmentation

        rows.append(("gpudash pool (one shard)", "Python calls", python_replay(one, p_alloc, pool.free, args.sample, p_frag)))

    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        base = CupyPool(total)
    except Exception as e:  # no CuPy, or no GPU/driver behind it
        print(f"CuPy unavailable ({type(e).__name__}: {str(e)[:80]}); baseline is {FirstFit.name}")
        base = FirstFit(total)
    rows.append((base.name, "Python calls",
                 python_replay(one, lambda _s, n: base.alloc(n), base.free, args.sample, base.fragmentation)))
    if isinstance(base, CupyPool):
        print(f"CuPy's pool has no capacity: it reserved {base.reserved() >> 20} MiB from cudaMalloc at peak "
              f"(gpudash's shards are fixed at {total >> 20} MiB), so it never refuses; its fragmentation is "
              f"measured inside what it reserved")
        base.close()

    ref = rows[-1][2]
    print(f"\n{'allocator':36} {'calls':14} {'ops/s':>12} {'pairs/s':>12} {'failed':>7} {'peak frag':>10} "
          f"{'mean frag':>10} {'ops/s ratio':>12} {'peak frag ratio':>16}")
    for name, calls, r in rows:
        fr = r["peak"] / ref["peak"] if ref["peak"] else float("nan")
        print(f"{name:36} {calls:14} {r['ops_s']:12,.0f} {r['ops_s'] / 2:12,.0f} {r['fails']:7d} {r['peak']:10.3f} "
              f"{r['mean']:10.3f} {r['ops_s'] / ref['ops_s']:11.1f}x {fr:15.2f}x")
    print("\nratios are against the last row (the baseline); peak frag ratio < 1 means less fragmented than it.")


if __name__ == "__main__":
    main()
