"""The per-(dst, src) plan memo: hits only for the very same live arrays, re-checks what can change,
forgets arrays when they die, and never memoizes what may change kind or be freed."""

from __future__ import annotations

import gc

import numpy as np
from gpudash.engine import _native as N
from gpudash.engine.plan import CopyPlan, PlanCache
from gpudash.engine.transfer import TransferEngine


class FakeGpuArray:
    """Stands in for a CuPy array: it exposes __cuda_array_interface__ and can be weakly referenced."""

    __cuda_array_interface__ = {"data": (0x10000, False), "shape": (64,), "typestr": "|u1", "version": 3}


def _plan(kind: int = N.MEM_PAGEABLE, owner: object | None = None) -> CopyPlan:
    import weakref

    return CopyPlan(N.D2H, 0, 64, kind, weakref.ref(owner) if owner is not None else None, 0x20000, 64, (),
                    N.CopyDescC(N.D2H, 0, 0x20000, 0x10000, 64))


def test_hit_only_for_the_same_live_pair_and_dropped_when_an_array_dies() -> None:
    cache, dev, host = PlanCache(), FakeGpuArray(), np.zeros(64, dtype=np.uint8)
    plan = _plan()
    cache.put(host, dev, plan)
    assert cache.get(host, dev) is None  # one miss: maybe a one-shot buffer, not memoized yet
    cache.put(host, dev, plan)  # the same pair missed again: memoized
    assert cache.get(host, dev) is plan
    assert cache.get(dev, host) is None  # the reverse direction is another pair
    assert cache.get(np.zeros(64, dtype=np.uint8), dev) is None
    del host
    gc.collect()
    assert not cache._memo


def test_a_numpy_destination_made_read_only_misses_so_the_copy_is_checked_again() -> None:
    cache, dev, host = PlanCache(), FakeGpuArray(), np.zeros(64, dtype=np.uint8)
    for _ in range(2):
        cache.put(host, dev, _plan())
    assert cache.get(host, dev) is not None
    host.flags.writeable = False
    assert cache.get(host, dev) is None


def test_engine_buffers_and_registrable_pinned_memory_are_not_memoized(fast_engine: TransferEngine) -> None:
    cache, dev, host = PlanCache(), FakeGpuArray(), np.zeros(64, dtype=np.uint8)
    for _ in range(2):
        cache.put(host, dev, _plan(N.MEM_PINNED, owner=host))  # numpy-owned pinned: may be our registration
    buf = fast_engine.alloc_device(0, 64)
    for _ in range(2):
        cache.put(host, buf, _plan())  # engine buffers can be freed
    assert not cache._memo

