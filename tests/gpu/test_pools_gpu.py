"""Memory pools on the CUDA backend (run on a GPU machine: pytest -m gpu tests/gpu/test_pools_gpu.py).

The device pool's slab is one cuMemAlloc through the engine; blocks handed out are real device memory:
CuPy writes and reads them, the engine copies into and out of them, and the driver's free memory
moves only when the slab is made or released, never per block. Self-contained: engine + CuPy.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from gpudash.engine import TransferEngine
from gpudash.engine.pools import MemoryPool, PoolExhaustedError, engine_pools
from gpudash.engine.traces import kv_tenant_trace

try:
    import cupy as cp
except ImportError:  # CI: these tests are deselected (-m 'not gpu') anyway
    cp = None

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason="needs CuPy and an NVIDIA GPU")]

MiB = 2**20


def as_cupy(ptr: int, nbytes: int, owner: object) -> "cp.ndarray":
    mem = cp.cuda.UnownedMemory(ptr, nbytes, owner)
    return cp.ndarray((nbytes,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))


def test_device_pool_blocks_are_device_memory_and_isolated(eng: TransferEngine) -> None:
    pool = MemoryPool(256 * MiB, engine=eng, gpu=0, shards={"kv": 192 * MiB, "staging": 64 * MiB})
    try:
        assert (pool.label, pool.name, pool.kind) == ("cuda", "gpu0", "device")
        attrs = cp.cuda.runtime.pointerGetAttributes(pool.base)
        kind = getattr(attrs, "type", getattr(attrs, "memoryType", None))  # renamed across CuPy versions
        assert kind == cp.cuda.runtime.memoryTypeDevice and attrs.device == 0
        rng = np.random.default_rng(0)
        blocks = []
        for i in range(200):
            shard = "kv" if i % 4 else "staging"
            try:
                blocks.append(pool.alloc(shard, int(rng.integers(1, 2 * MiB)), align=int(rng.choice([256, 4096]))))
            except PoolExhaustedError:
                break
        for i, b in enumerate(blocks):  # each block gets its own byte value
            as_cupy(b.ptr, b.nbytes, pool).fill(i % 251)
        cp.cuda.Device(0).synchronize()
        for i, b in enumerate(blocks):  # no block overwrote another
            assert int(as_cupy(b.ptr, b.nbytes, pool).min()) == int(as_cupy(b.ptr, b.nbytes, pool).max()) == i % 251
        for b in blocks[::2]:
            pool.free(b)
        pool.check()
        kv = pool.shard_stats("kv")
        assert kv.used + kv.free == kv.capacity == 192 * MiB
    finally:
        pool.close()


def test_slab_is_the_only_driver_allocation(eng: TransferEngine) -> None:
    cp.cuda.Device(0).synchronize()
    free0, _ = cp.cuda.runtime.memGetInfo()
    pool = MemoryPool(512 * MiB, engine=eng, gpu=0, shards={"kv": 512 * MiB})
    free1, _ = cp.cuda.runtime.memGetInfo()
    assert free0 - free1 >= 512 * MiB
    blocks = [pool.alloc("kv", 4 * MiB) for _ in range(100)]
    free2, _ = cp.cuda.runtime.memGetInfo()
    assert abs(free2 - free1) < 8 * MiB, "blocks must come out of the slab, not from the driver"
    for b in blocks:
        pool.free(b)
    pool.close()
    free3, _ = cp.cuda.runtime.memGetInfo()
    assert free3 - free1 >= 512 * MiB - 8 * MiB


def test_engine_copies_through_pool_blocks(eng: TransferEngine) -> None:
    pools = engine_pools(eng, host_bytes=64 * MiB, device_bytes=64 * MiB, shards={"kv": 0.75, "staging": 0.25})
    try:
        host, dev = pools["host"], pools["gpu0"]
        assert host.label == "cuda" and host.kind == "host"
        n = 24 * MiB + 123
        h = host.alloc("kv", n)
        d = dev.alloc("kv", n)
        src = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
        ctypes.memmove(h.ptr, src.ctypes.data, n)
        eng.copy(d.ptr, h.ptr, nbytes=n).wait()
        assert cp.array_equal(as_cupy(d.ptr, n, dev), cp.asarray(src))
        back = host.alloc("staging", n - 123 - 8 * MiB)  # 16 MiB fits the 16 MiB staging shard
        eng.copy(back.ptr, d.ptr, nbytes=back.nbytes).wait()
        got = np.ctypeslib.as_array((ctypes.c_uint8 * back.nbytes).from_address(back.ptr))
        assert np.array_equal(got, src[:back.nbytes])
    finally:
        for p in pools.values():
            p.close()


def test_trace_replay_on_a_device_slab(eng: TransferEngine) -> None:
    trace = kv_tenant_trace(100_000, capacity=64 * MiB, seed=3)
    with MemoryPool(sum(trace.capacity.values()), engine=eng, gpu=0, shards=trace.capacity) as pool:
        res = pool.replay(trace, check_every=97)
        assert res.checks == len(trace) // 97 and res.allocs > 10_000
        pool.check()


def test_engine_pools_hold_its_staging_and_relay_buffers(eng: TransferEngine) -> None:
    pools = eng.pools()
    host = pools["engine-host"]
    assert (host.label, host.kind, host.shards) == ("cuda", "host", ("staging",))
    attrs = cp.cuda.runtime.pointerGetAttributes(host.base)
    assert getattr(attrs, "type", getattr(attrs, "memoryType", None)) == cp.cuda.runtime.memoryTypeHost  # pinned
    topo = eng.topology()
    relaying = {v for v in range(eng.num_gpus) for g in range(eng.num_gpus) if topo.peer[v][g] is not None}
    assert set(pools) == {"engine-host", *(f"engine-gpu{v}" for v in relaying)}
    for v in relaying:
        p = pools[f"engine-gpu{v}"]
        attrs = cp.cuda.runtime.pointerGetAttributes(p.base)
        assert getattr(attrs, "type", getattr(attrs, "memoryType", None)) == cp.cuda.runtime.memoryTypeDevice
        assert (attrs.device, p.shards, p.label) == (v, ("relay",), "cuda")
    src = np.random.default_rng(5).integers(0, 256, 256 * MiB, dtype=np.uint8)  # pageable: staged
    dev = cp.empty(src.nbytes, dtype=cp.uint8)
    peak = 0
    h = eng.copy(dev, src, pageable="stage")
    while not h.done():
        peak = max(peak, host.shard_stats("staging").used)
    h.wait()
    assert cp.array_equal(dev, cp.asarray(src))
    assert peak > 0, "staged chunks hold blocks of the staging shard while they are in flight"
    st = host.shard_stats("staging")
    assert (st.used, st.allocations, st.failures) == (0, 0, 0)
