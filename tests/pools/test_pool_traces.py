"""Randomised alloc/free traces with the invariants checked after every operation.

The invariant walk runs natively (gp_check via MemoryPool.replay(check_every=1)): the slab is tiled
exactly by the shards' blocks plus unassigned ranges (no overlap, every byte accounted for, shards
isolated), touching free blocks are merged, the counters match the blocks, fragmentation matches
1 - largest_free / free. A second test drives the public Python API and checks the same properties
from the outside against an independent model of the live blocks.
"""

from __future__ import annotations

import bisect

import numpy as np
import pytest

from gpudash.engine.pools import MemoryPool, PoolExhaustedError
from gpudash.engine.traces import kv_tenant_trace


@pytest.mark.parametrize("seed,aligned,policy", [(1, False, "best"), (2, True, "best"), (3, True, "banded")])
def test_native_replay_checks_every_step(seed: int, aligned: bool, policy: str) -> None:
    trace = kv_tenant_trace(200_000, capacity=64 << 20, fill=0.9, aligned=aligned, seed=seed)
    with MemoryPool(len(trace.shards) * (64 << 20) + (1 << 20), shards=trace.capacity, policy=policy) as pool:
        res = pool.replay(trace, check_every=1)
        assert res.checks == len(trace)
        assert res.allocs + res.failures == int((trace.op == 0).sum())
        assert res.failures > 0, "the trace should push shards past full so the failure path runs"
        assert res.allocs > 50_000 and res.frees > 50_000
        # replay frees what is still live at the end: every shard is back to one free block
        for s in pool.stats():
            assert (s.used, s.free, s.free_blocks, s.fragmentation) == (0, s.capacity, 1, 0.0)
        assert sum(s.failures for s in pool.stats()) == res.failures
        pool.check()


def test_replay_is_deterministic() -> None:
    trace = kv_tenant_trace(20_000, capacity=16 << 20, seed=5)
    with MemoryPool(4 * (16 << 20), shards=trace.capacity) as pool:
        a = pool.replay(trace, sample_every=10)
        b = pool.replay(trace, sample_every=10)
    assert (a.allocs, a.failures, a.peak_fragmentation, a.peak_used) == \
        (b.allocs, b.failures, b.peak_fragmentation, b.peak_used)
    assert 0 < a.peak_fragmentation < 1 and a.peak_used > 0


def test_python_api_against_a_model() -> None:
    """40k random ops through alloc()/free(): blocks never overlap (across shards too), are aligned,
    lie in the slab; stats agree with the model; a failure only happens when no free block fits."""
    rng = np.random.default_rng(7)
    caps = {"kv": 3 << 20, "scratch": 1 << 20, "staging": 2 << 20}
    pool = MemoryPool(8 << 20, granule=256, shards=caps)
    starts: list[int] = []          # sorted starts of live blocks
    ends: dict[int, int] = {}       # start -> end (rounded block)
    live: dict[str, list] = {s: [] for s in caps}
    used = {s: 0 for s in caps}
    names = list(caps)
    for step in range(40_000):
        shard = names[rng.integers(3)]
        if live[shard] and rng.random() < 0.48:
            blk = live[shard].pop(int(rng.integers(len(live[shard]))))
            pool.free(blk)
            starts.remove(blk.ptr)
            used[shard] -= ends.pop(blk.ptr) - blk.ptr
        else:
            n = int(rng.integers(1, 96 << 10))
            align = int(rng.choice([256, 256, 1024, 8192]))
            try:
                blk = pool.alloc(shard, n, align=align)
            except PoolExhaustedError as e:
                st = pool.shard_stats(shard)
                assert e.largest_free == st.largest_free
                assert st.largest_free < -(-n // 256) * 256 + align, "refused although a block was big enough"
                continue
            size = -(-n // 256) * 256
            assert blk.ptr % align == 0 and pool.base <= blk.ptr and blk.ptr + size <= pool.base + pool.nbytes
            i = bisect.bisect(starts, blk.ptr)
            assert i == 0 or ends[starts[i - 1]] <= blk.ptr, f"overlap with the block before at step {step}"
            assert i == len(starts) or blk.ptr + size <= starts[i], f"overlap with the block after at step {step}"
            starts.insert(i, blk.ptr)
            ends[blk.ptr] = blk.ptr + size
            live[shard].append(blk)
            used[shard] += size
        if step % 97 == 0:
            for st in pool.stats():
                assert st.used == used[st.shard] and st.capacity == caps[st.shard]
                assert st.used + st.free == st.capacity
                want = 1 - st.largest_free / st.free if st.free else 0.0
                assert st.fragmentation == pytest.approx(want, abs=1e-12)
                assert st.allocations == len(live[st.shard])
            pool.check()
    pool.check()
    pool.close()


def test_banded_policy_prefers_low_addresses() -> None:
    with MemoryPool(1 << 20, shards={"a": 1 << 20}, policy="banded") as pool:
        blocks = [pool.alloc("a", 4096) for _ in range(8)]
        pool.free(blocks[6])  # a 4 KiB hole high up ...
        pool.free(blocks[1])  # ... and one low down, same size
        pool.free(blocks[3])
        pool.free(blocks[4])  # merges with 3: an 8 KiB hole in the middle
        assert pool.alloc("a", 4096).ptr == blocks[1].ptr
        assert pool.alloc("a", 4096).ptr == blocks[3].ptr, "the 8 KiB hole is within the band and lower"
    with MemoryPool(1 << 20, shards={"a": 1 << 20}, policy="best") as pool:  # best fit: the exact-size hole
        blocks = [pool.alloc("a", 4096) for _ in range(8)]
        for i in (6, 3, 4):
            pool.free(blocks[i])
        assert pool.alloc("a", 4096).ptr == blocks[6].ptr
