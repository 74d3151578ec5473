"""PoolSource: each memory pool's slab (`pools`) and every shard (`pool_shards`) as samples each tick."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from gpudash.records import PoolSample, PoolShardSample


class PoolSource:
    """Telemetry source over pools the app owns (closing the source leaves the pools open).

    `pools` is an iterable of `engine.pools.MemoryPool`, or a callable returning one (pools may be
    created, resized and closed while the sampler runs; a closed pool simply yields no rows).
    """

    name = "pools"

    def __init__(self, pools: Iterable[Any] | Callable[[], Iterable[Any]]):
        self._pools = pools

    def poll(self) -> dict[str, tuple]:
        pools = [p for p in (self._pools() if callable(self._pools) else self._pools) if not p.closed]
        ts = time.time()
        slabs = tuple(PoolSample(ts=ts, pool=p.name, slab=p.nbytes, unassigned=p.unassigned) for p in pools)
        shards = tuple(PoolShardSample(ts=ts, pool=s.pool, shard=s.shard, capacity=s.capacity, used=s.used,
                                       free=s.free, largest_free=s.largest_free, free_blocks=s.free_blocks,
                                       fragmentation=s.fragmentation, failures=s.failures)
                       for pool in pools for s in pool.stats())
        return {"pools": slabs, "pool_shards": shards}

    def close(self) -> None:
        """Nothing to release: the pools belong to whoever created them."""
