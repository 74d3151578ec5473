"""Pools over a sim-backend engine: slabs come from the engine, real bytes move through the engine
into and out of pool blocks, and PoolSource turns the shards into samples the sampler records."""

from __future__ import annotations

import numpy as np
import pytest

from gpudash.engine import EngineArgumentError, EngineConfig, TransferEngine
from gpudash.engine.pools import MemoryPool, engine_pools
from gpudash.records import PoolSample, PoolShardSample
from gpudash.telemetry.pools import PoolSource
from gpudash.telemetry.sampler import Sampler


@pytest.fixture
def eng():
    e = TransferEngine(EngineConfig(backend="sim", profile="rtx5080+rtx3090", sim_time_scale=1.0))
    yield e
    e.close()


def test_engine_pools_are_labelled_sim(eng: TransferEngine) -> None:
    pools = engine_pools(eng, host_bytes=4 << 20, device_bytes=8 << 20, shards={"kv": 0.75, "staging": 0.25})
    try:
        assert list(pools) == ["sim-host", "sim-gpu0", "sim-gpu1"]
        assert all(p.label == "sim" for p in pools.values())
        assert pools["sim-gpu1"].kind == "device" and pools["sim-host"].kind == "host"
        assert [s.capacity for s in pools["sim-gpu0"].stats()] == [6 << 20, 2 << 20]
    finally:
        for p in pools.values():
            p.close()


def test_bytes_round_trip_through_pool_blocks(eng: TransferEngine) -> None:
    dev = MemoryPool(16 << 20, engine=eng, gpu=1, shards={"kv": 12 << 20})
    host = MemoryPool(16 << 20, engine=eng, shards={"staging": 12 << 20})
    try:
        d = dev.alloc("kv", 3 << 20)
        h = host.alloc("staging", 3 << 20)
        src = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
        eng.copy(d.ptr, src, nbytes=src.nbytes).wait()
        eng.copy(h.ptr, d.ptr, nbytes=src.nbytes).wait()
        back = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * src.nbytes).from_address(h.ptr))
        assert np.array_equal(back, src)
        dev.free(d)
        host.free(h)
    finally:
        dev.close()
        host.close()


def test_pool_slab_too_big_for_the_engine_is_one_error(eng: TransferEngine) -> None:
    with pytest.raises(EngineArgumentError, match="gpu=7 does not exist"):
        MemoryPool(1 << 20, engine=eng, gpu=7)


def test_pool_source_through_the_sampler(eng: TransferEngine) -> None:
    pool = MemoryPool(1 << 20, engine=eng, gpu=0, shards={"kv": 512 << 10, "relay": 256 << 10})
    blocks = [pool.alloc("kv", 64 << 10) for _ in range(4)]
    pool.free(blocks[1])
    with pytest.raises(MemoryError):
        pool.alloc("relay", 300 << 10)
    sampler = Sampler([PoolSource(lambda: [pool])], interval_s=1.0, source_label="sim:rtx5080+rtx3090")
    snap = sampler.poll_once()
    rows = {s.shard: s for s in snap.pool_shards}
    assert set(rows) == {"kv", "relay"} and all(isinstance(s, PoolShardSample) for s in rows.values())
    kv = rows["kv"]
    assert (kv.pool, kv.capacity, kv.used, kv.free_blocks) == ("sim-gpu0", 512 << 10, 192 << 10, 2)
    assert kv.fragmentation == pytest.approx(1 - (256 << 10) / (320 << 10))
    assert rows["relay"].failures == 1 and rows["relay"].fragmentation == 0.0
    assert snap.pools == (PoolSample(snap.pools[0].ts, "sim-gpu0", slab=1 << 20, unassigned=256 << 10),)
    pool.resize("relay", 512 << 10)  # the relay shard grows into all that was unassigned
    assert sampler.poll_once().pools[0].unassigned == 0
    pool.close()
    closed = sampler.poll_once()
    assert closed.pool_shards == () and closed.pools == ()
    sampler.stop()


def test_factory_adds_the_pool_source(eng: TransferEngine) -> None:
    from gpudash.config import Config
    from gpudash.telemetry.factory import build_sources

    pool = MemoryPool(1 << 20, engine=eng, gpu=0, shards={"kv": 1 << 20})
    sources = build_sources("sim:rtx5080+rtx3090", Config(), engine=eng, pools=lambda: [pool])
    try:
        snap = Sampler(sources, interval_s=1.0, source_label="sim:rtx5080+rtx3090").poll_once()
        assert [(s.pool, s.shard, s.capacity) for s in snap.pool_shards] == [("sim-gpu0", "kv", 1 << 20)]
    finally:
        for s in sources:
            s.close()
        pool.close()


def test_a_pool_without_shards_still_reports_its_slab(eng: TransferEngine) -> None:
    """Its whole slab is unassigned; there is no shard row to carry that, so the pool has a row of its own."""
    pool = MemoryPool(3 << 20, engine=eng)
    try:
        polled = PoolSource([pool]).poll()
        assert polled["pool_shards"] == ()
        assert [(p.pool, p.slab, p.unassigned) for p in polled["pools"]] == [("sim-host", 3 << 20, 3 << 20)]
    finally:
        pool.close()
