"""The engine's own pools: its staging slots and relay buffers are blocks of `engine-host` / `engine-gpuN`
shards, sized from the knobs, held by chunks in flight, grown (or refused) when the knobs change."""

from __future__ import annotations

import numpy as np
import pytest

from gpudash.engine import EngineArgumentError, EngineConfig, TransferEngine
from gpudash.engine.pools import PoolError
from gpudash.telemetry.pools import PoolSource

MiB = 2**20


def page(n: int) -> int:
    return -(-n // 4096) * 4096


def capacities(eng: TransferEngine) -> dict[str, int]:
    return {name: p.stats()[0].capacity for name, p in eng.pools().items()}


def test_pools_exist_with_their_shards_sized_from_the_knobs(make_engine) -> None:
    eng = make_engine("8xh20")
    pools = eng.pools()
    assert list(pools) == ["engine-host"] + [f"engine-gpu{g}" for g in range(8)]
    assert all(p.label == "sim" for p in pools.values())
    host = pools["engine-host"]
    assert (host.kind, host.shards, host.nbytes) == ("host", ("staging",), 32 * 4 * MiB)
    assert host.stats()[0].capacity == 32 * 4 * MiB  # 32 slots of min(largest chunk, 4 MiB)
    cfg = EngineConfig()
    # outstanding x 7 peers x 2 directions buffers, each the size of the largest chunk
    relay = 2 * 7 * 2 * page(max(cfg.h2d_chunk_bytes, cfg.d2h_chunk_bytes))
    for g in range(8):
        p = pools[f"engine-gpu{g}"]
        assert (p.kind, p.gpu, p.shards, p.nbytes) == ("device", g, ("relay",), 4 * relay)
        st = p.stats()[0]
        assert (st.capacity, st.used, st.allocations, st.failures) == (relay, 0, 0, 0)
    small = make_engine("8xh20", h2d_chunk_bytes=1 * MiB, d2h_chunk_bytes=1 * MiB)
    assert capacities(small)["engine-host"] == 32 * MiB


@pytest.mark.parametrize("profile", ["h200", "rtx5080+rtx3090"])
def test_rigs_without_peer_paths_have_only_the_staging_pool(make_engine, profile: str) -> None:
    assert list(make_engine(profile).pools()) == ["engine-host"]


def test_staging_and_relay_blocks_show_while_copies_run(make_engine) -> None:
    eng = make_engine("8xh20")
    src = np.random.default_rng(0).integers(0, 256, 96 * MiB, dtype=np.uint8)  # pageable: staged
    dev = eng.alloc_device(0, src.nbytes)
    source = PoolSource(lambda: eng.pools().values())
    peak: dict[tuple[str, str], int] = {}
    h = eng.copy(dev, src, pageable="stage")
    while not h.done():
        for s in source.poll()["pool_shards"]:
            peak[(s.pool, s.shard)] = max(peak.get((s.pool, s.shard), 0), s.used)
    h.wait()
    assert np.array_equal(dev.host_view(), src)
    assert peak[("engine-host", "staging")] > 0, "staged chunks hold blocks of the staging shard"
    assert sum(v for (pool, _s), v in peak.items() if pool != "engine-host") > 0, "relayed chunks hold relay blocks"
    assert peak.get(("engine-gpu0", "relay"), 0) == 0, "GPU 0 is the target: nothing relays through it"
    for p in eng.pools().values():  # every block went back when its chunk landed; equal blocks never miss
        st = p.stats()[0]
        assert (st.used, st.allocations, st.free_blocks, st.failures) == (0, 0, 1, 0)
        p.check()


def test_knob_changes_grow_the_shards_and_a_copy_in_flight_keeps_its_blocks(make_engine) -> None:
    eng = make_engine("8xh20", h2d_chunk_bytes=1 * MiB, d2h_chunk_bytes=1 * MiB)
    slab = eng.pools()["engine-gpu1"].nbytes
    assert slab == 4 * 2 * 7 * 2 * MiB and capacities(eng)["engine-gpu1"] == 28 * MiB
    src = np.random.default_rng(1).integers(0, 256, 64 * MiB, dtype=np.uint8)
    dev = eng.alloc_device(2, src.nbytes)
    h = eng.copy(dev, src, pageable="stage")
    eng.set(outstanding=4)  # relay shards double, the staging shard stays
    caps = capacities(eng)
    assert caps["engine-gpu1"] == 56 * MiB and caps["engine-host"] == 32 * MiB
    eng.set(d2h_chunk_bytes=4 * MiB)  # slots of 4 MiB; relays want 4 x 7 x 5 MiB, more than the pool: all of it
    caps = capacities(eng)
    assert caps["engine-host"] == 128 * MiB and caps["engine-gpu1"] == slab
    h.wait()
    assert np.array_equal(dev.host_view(), src)
    eng.set(outstanding=1, d2h_chunk_bytes=1 * MiB)  # shards never shrink under copies that may use them
    assert capacities(eng) == caps
    for p in eng.pools().values():
        p.check()


def test_knobs_that_cannot_fit_are_refused_and_change_nothing(make_engine) -> None:
    eng = make_engine("8xh20")
    before, caps = eng.knobs(), capacities(eng)
    with pytest.raises(EngineArgumentError, match=r"knobs h2d_chunk_bytes=1073741824, outstanding=3 refused: one "
                                                  r"chunk on each relay path needs \d+ bytes in shard 'relay' of "
                                                  r"pool 'engine-gpu0', whose memory holds \d+ bytes"):
        eng.set(h2d_chunk_bytes=1 << 30, outstanding=3)
    assert eng.knobs() == before and capacities(eng) == caps


def test_the_engine_owns_its_shards(make_engine) -> None:
    eng = make_engine("8xh20")
    relay = eng.pools()["engine-gpu3"]
    cap = relay.stats()[0].capacity
    with pytest.raises(PoolError, match=rf"cannot shrink shard 'relay' of pool 'engine-gpu3' .* keep at least {cap}"):
        relay.resize("relay", cap - 4096)
    relay.resize("relay", cap + 8 * MiB)  # an operator may give it more
    assert relay.stats()[0].capacity == cap + 8 * MiB
    with pytest.raises(PoolError, match="belongs to the transfer engine"):
        relay.add_shard("kv", MiB)
    with pytest.raises(PoolError, match="cannot be removed"):
        relay.remove_shard("relay")
    relay.close()  # detaches the view only
    assert eng.pools()["engine-gpu3"].stats() == ()
    views = eng.pools()
    eng.close()
    assert all(p.closed and p.stats() == () for p in views.values())


def test_relay_shard_exhaustion_is_counted_and_copies_stay_exact(make_engine) -> None:
    """Shards capped at their pool (outstanding=64 needs 8x the pool): relayed chunks that find no block
    wait for one (the pool counts each miss), and every copy still lands byte-exact."""
    eng = make_engine("8xh20", sim_time_scale=1.0, h2d_chunk_bytes=64 * 1024, d2h_chunk_bytes=64 * 1024,
               h2d_fallback_bytes=0, direct_first=False)
    eng.set(outstanding=64)
    assert capacities(eng)["engine-gpu1"] == eng.pools()["engine-gpu1"].nbytes == 4 * 2 * 7 * 128 * 1024
    src = np.random.default_rng(2).integers(0, 256, 32 * MiB, dtype=np.uint8)
    pinned = eng.alloc_host(src.nbytes)
    pinned.array()[:] = src
    devs = [eng.alloc_device(g, src.nbytes) for g in range(8)]
    for h in [eng.copy(d, pinned) for d in devs]:  # into every GPU at once: each relays for seven
        h.wait()
    assert all(np.array_equal(d.host_view(), src) for d in devs)
    stats = [p.stats()[0] for name, p in eng.pools().items() if name != "engine-host"]
    assert sum(s.failures for s in stats) > 0 and all(s.used == 0 for s in stats)
