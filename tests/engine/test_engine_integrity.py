"""Byte-exact results for thousands of random copies through the sim backend's real data plane:
sizes 1 B..256 MiB, odd offsets, pinned / pageable (staged and registered), several threads at once,
multipath and single-path, chunk sizes changed between batches. Guard bytes catch any overrun."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from gpudash.engine import EngineArgumentError, TransferEngine
from gpudash.engine._native import MEM_PAGEABLE
from gpudash.engine.buffers import SpanCache

MiB = 2**20
GUARD = 64


def _log_sizes(rng: np.random.Generator, n: int, hi: int) -> list[int]:
    return [int(x) for x in np.exp(rng.uniform(0, np.log(hi), n)).astype(np.int64).clip(1, hi)]


def _round_trip(eng: TransferEngine, rng: np.random.Generator, host: np.ndarray, out: np.ndarray, devs: list,
                size: int) -> None:
    """h2d from an odd offset of `host` into an odd offset of a device buffer, d2h back into `out`;
    check the bytes and that nothing outside the ranges changed."""
    dev = devs[int(rng.integers(len(devs)))]
    so = int(rng.integers(0, host.size - size + 1)) | 1 if host.size - size >= 1 else 0
    so = min(so, host.size - size)
    do = GUARD + (int(rng.integers(0, dev.nbytes - size - 2 * GUARD + 1)) | 1)
    do = min(do, dev.nbytes - size - GUARD)
    view = dev.host_view()
    before_lo, before_hi = view[do - GUARD:do].copy(), view[do + size:do + size + GUARD].copy()
    src = host[so:so + size]
    sync = bool(rng.integers(2))  # copy(sync=True) issues and completes single-path copies on this thread
    eng.copy(dev.ptr + do, src, nbytes=size, sync=sync).wait()
    assert np.array_equal(view[do:do + size], src), f"h2d of {size} B at +{so} -> gpu{dev.gpu}+{do} differs"
    assert np.array_equal(view[do - GUARD:do], before_lo) and np.array_equal(view[do + size:do + size + GUARD],
                                                                              before_hi), "h2d wrote outside its range"
    oo = int(rng.integers(0, out.size - size - 2 * GUARD + 1)) | 1
    oo = min(oo, out.size - size - GUARD)
    out[oo - GUARD:oo + size + GUARD] = 0xA5
    eng.copy(out[oo:oo + size], dev.ptr + do, nbytes=size, sync=sync).wait()
    assert np.array_equal(out[oo:oo + size], src), f"d2h of {size} B from gpu{dev.gpu}+{do} differs"
    assert (out[oo - GUARD:oo] == 0xA5).all() and (out[oo + size:oo + size + GUARD] == 0xA5).all(), \
        "d2h wrote outside its range"


def test_thousands_of_random_copies_are_byte_exact(fast_engine: TransferEngine) -> None:
    eng = fast_engine
    eng.set(h2d_fallback_bytes=256 * 1024, d2h_fallback_bytes=512 * 1024, h2d_chunk_bytes=64 * 1024,
            d2h_chunk_bytes=96 * 1024)
    n_threads, per_thread = 4, 600
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            pinned = eng.alloc_host(8 * MiB)
            pageable = rng.integers(0, 256, 8 * MiB, dtype=np.uint8)
            hosts = [pinned.array(), pageable]
            hosts[0][:] = rng.integers(0, 256, 8 * MiB, dtype=np.uint8)
            out = np.zeros(8 * MiB + 4 * GUARD, dtype=np.uint8)
            devs = [eng.alloc_device(g, 8 * MiB) for g in rng.choice(eng.num_gpus, 3, replace=False)]
            for size in _log_sizes(rng, per_thread, 4 * MiB):
                _round_trip(eng, rng, hosts[int(rng.integers(2))], out, devs, size)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    moved = sum(p.bytes for p in eng.stats().paths)
    assert moved > 0
    relayed = [p for p in eng.stats().paths if p.via is not None and p.chunks]
    assert relayed, "multipath copies should have used relay paths"


@pytest.mark.parametrize("size", [1, 3, 4095, 11_300_001, 64 * MiB + 7, 256 * MiB])
def test_large_and_edge_sizes_round_trip(fast_engine: TransferEngine, size: int) -> None:
    eng = fast_engine
    rng = np.random.default_rng(size)
    src = rng.integers(0, 256, size + 1, dtype=np.uint8)[1:]  # odd address
    dev = eng.alloc_device(3, size + 1)
    info = eng.copy(dev.ptr + 1, src, nbytes=size).wait()
    assert info.nbytes == size
    assert np.array_equal(dev.host_view()[1:size + 1], src)
    back = np.empty(size, dtype=np.uint8)
    eng.copy(back, dev.ptr + 1, nbytes=size).wait()
    assert np.array_equal(back, src)
    dev.free()


def test_pageable_policy_stages_then_registers_and_data_stays_exact(fast_engine: TransferEngine) -> None:
    eng = fast_engine
    src = np.arange(32 * MiB, dtype=np.uint8)
    dev = eng.alloc_device(0, src.nbytes)
    modes = []
    for i in range(3):
        src[:16] = i
        modes.append(eng.copy(dev, src).wait().host_mode)
        assert np.array_equal(dev.host_view(), src)
    assert modes == ["staged", "registered", "registered"]
    eng.set(registration_cache_bytes=0)  # evicts the registration; next copies stage again
    assert eng.copy(dev, src).wait().host_mode == "staged"
    pinned = eng.alloc_host(src.nbytes)
    assert eng.copy(pinned, dev).wait().host_mode == "pinned"
    assert np.array_equal(pinned.array(), src)


def test_registration_dropped_when_array_is_freed(fast_engine: TransferEngine) -> None:
    """A new array at the same address must not reuse the old registration (safe invalidation)."""
    eng = fast_engine
    dev = eng.alloc_device(0, 16 * MiB)
    for fill in (1, 2, 3):
        a = np.full(16 * MiB, fill, dtype=np.uint8)
        eng.copy(dev, a).wait()
        eng.copy(dev, a).wait()
        assert (dev.host_view() == fill).all()
        del a
    assert eng._regcache.bytes == 0


def test_buffer_protocol_and_dlpack_inputs(fast_engine: TransferEngine) -> None:
    eng = fast_engine
    dev = eng.alloc_device(1, 1000)
    payload = bytes(range(256)) * 3 + b"x" * 232
    eng.copy(dev, payload).wait()
    out = bytearray(1000)
    eng.copy(out, dev).wait()
    assert bytes(out) == payload
    arr = np.arange(250, dtype=np.float32)  # 1000 bytes, via DLPack
    eng.copy(dev, np.from_dlpack(arr)).wait()
    back = np.zeros(250, dtype=np.float32)
    eng.d2h(back, dev).wait()
    assert np.array_equal(back, arr)


def test_sim_buffers_dropped_without_free_and_views_after_close(make_engine) -> None:  # type: ignore[no-untyped-def]
    eng = make_engine("rtx5080+rtx3090", sim_time_scale=1.0)
    for _ in range(50):  # numpy reuses the addresses: stale sim records must not block new buffers
        eng.alloc_device(0, 8 * MiB)
        eng.alloc_host(8 * MiB)
    dev = eng.alloc_device(1, 1 * MiB)
    eng.copy(dev, np.full(1 * MiB, 6, dtype=np.uint8)).wait()
    view = dev.host_view()
    dev.free()
    eng.close()
    assert int(view.sum()) == 6 * MiB  # the view keeps the memory alive: no dangling pointer


def test_sync_copy_returns_a_finished_handle(fast_engine: TransferEngine) -> None:
    eng = fast_engine
    dev = eng.alloc_device(0, 512 * 1024)
    data = np.arange(512 * 1024, dtype=np.uint8)
    h = eng.copy(dev, data, sync=True)  # first sight of a pageable buffer under the staging threshold: one driver copy
    assert h.done() and h.wait().host_mode == "driver" and (h.wait().chunks, h.wait().paths_used) == (1, 1)
    out = np.zeros(512 * 1024, dtype=np.uint8)
    info = eng.d2h(out, dev, sync=True).wait()
    assert np.array_equal(out, data) and (info.chunks, info.paths_used) == (1, 1)


def test_one_shot_pageable_copies_below_the_staging_threshold_are_one_driver_copy(fast_engine: TransferEngine) -> None:
    eng = fast_engine
    eng.set(h2d_staging_bytes=2 * MiB, d2h_staging_bytes=1 * MiB)
    dev = eng.alloc_device(0, 8 * MiB)
    # (size, expected h2d mode, expected d2h mode): the threshold itself already stages
    for n, up_mode, down_mode in [(MiB, "driver", "staged"), (2 * MiB, "staged", "staged"),
                                  (512 * 1024, "driver", "driver")]:
        src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
        up = eng.copy(dev, src, sync=n == MiB).wait()
        back = np.empty(n, dtype=np.uint8)
        down = eng.copy(back, dev, nbytes=n).wait()
        assert (up.host_mode, down.host_mode) == (up_mode, down_mode), n
        assert np.array_equal(back, src)
    big = np.full(8 * MiB, 4, dtype=np.uint8)
    assert eng.copy(dev, big, pageable="driver").wait().host_mode == "driver"  # forced, whatever the size
    # forced policies leave no trace: the first "auto" copy is a first sight, the next one a reuse
    assert [eng.copy(dev, big).wait().host_mode for _ in range(2)] == ["staged", "registered"]
    eng.set(h2d_staging_bytes=0)
    assert eng.copy(dev, np.ones(64, dtype=np.uint8)).wait().host_mode == "staged"  # 0: always stage
    assert (dev.host_view()[:64] == 1).all() and (dev.host_view()[64:] == 4).all()


def test_memoized_arrays_are_still_checked_and_forgotten_when_they_die(fast_engine: TransferEngine) -> None:
    eng = fast_engine
    dev = eng.alloc_device(0, MiB)
    out = np.zeros(MiB, dtype=np.uint8)
    eng.copy(out, dev, sync=True)
    out.flags.writeable = False  # a memoized array's writeable flag is read again on every copy
    with pytest.raises(EngineArgumentError, match="dst is read-only"):
        eng.copy(out, dev)
    calls: list[int] = []

    def kind(ptr: int) -> tuple[int, None, int]:
        calls.append(ptr)
        return MEM_PAGEABLE, None, 0

    memo = SpanCache()
    a = np.ones(4096, dtype=np.uint8)
    assert memo.resolve(a, "src", None, kind, kind).ptr == memo.resolve(a, "src", None, kind, kind).ptr
    assert len(calls) == 1
    del a
    gc.collect()
    assert not memo._memo


def test_sync_copy_between_raw_pointers_returns_a_landed_handle(fast_engine: TransferEngine) -> None:
    """No registration and no engine buffer to account for: the cheap finished handle."""
    eng = fast_engine
    dev, host = eng.alloc_device(0, MiB), eng.alloc_host(MiB)
    host.array()[:] = 7
    h = eng.copy(dev.ptr, host.ptr, nbytes=MiB, sync=True)
    assert h.done() and h.wait() == h.wait(timeout=1.0)
    assert tuple(h.wait()) == ("h2d", 0, MiB, "pinned", 1, 1) and (dev.host_view() == 7).all()


def test_sync_copies_of_a_registered_buffer_give_the_registration_back(fast_engine: TransferEngine) -> None:
    """A registration in use by a copy cannot be evicted; a landed synchronous copy must release it."""
    eng = fast_engine
    src = np.full(MiB, 3, dtype=np.uint8)
    dev = eng.alloc_device(0, MiB)
    modes = [eng.copy(dev, src, sync=True).wait().host_mode for _ in range(3)]
    assert modes == ["staged", "registered", "registered"] and eng._regcache.bytes == MiB  # 1 MiB: first sight stages
    eng.set(registration_cache_bytes=0)
    assert eng._regcache.bytes == 0 and (dev.host_view() == 3).all()


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_staged_chunks_copied_in_pieces_over_the_staging_threads_are_byte_exact(fast_engine: TransferEngine,
                                                                                 threads: int) -> None:
    """A staged chunk's memcpy is split into pieces run by several staging threads (D2H drains into
    faulted memory with streaming stores, into fresh memory whole): odd offsets and lengths, whole
    chunks and short ones, land exactly and nothing outside the range is written."""
    eng = fast_engine
    eng.set(staging_threads=threads, h2d_chunk_bytes=4 * MiB, d2h_chunk_bytes=2 * MiB)
    rng = np.random.default_rng(threads)
    host = rng.integers(0, 256, 40 * MiB, dtype=np.uint8)
    out = np.zeros(host.size + 2 * GUARD, dtype=np.uint8)
    dev = eng.alloc_device(0, host.size + 2 * GUARD)
    view = dev.host_view()
    for size in (5 * MiB + 77, 2 * MiB, 33 * MiB + 4095, 4 * MiB + 1):
        so, do = int(rng.integers(1, 4096)) | 1, GUARD + 3
        src = host[so:so + size]
        view[:] = 0x5A
        assert eng.copy(dev.ptr + do, src, nbytes=size, pageable="stage", sync=True).wait().host_mode == "staged"
        assert np.array_equal(view[do:do + size], src), f"staged h2d of {size} B differs"
        assert (view[:do] == 0x5A).all() and (view[do + size:] == 0x5A).all(), "staged h2d wrote outside its range"
        out[:] = 0xA5
        got = out[GUARD + 1:GUARD + 1 + size]
        assert eng.copy(got, dev.ptr + do, nbytes=size, pageable="stage", sync=True).wait().host_mode == "staged"
        assert np.array_equal(got, src), f"staged d2h of {size} B differs"
        assert (out[:GUARD + 1] == 0xA5).all() and (out[GUARD + 1 + size:] == 0xA5).all(), \
            "staged d2h wrote outside its range"
        fresh = np.empty(size + 4096, dtype=np.uint8)[5:5 + size]  # mmap'd, never touched: not faulted in
        assert eng.copy(fresh, dev.ptr + do, nbytes=size, pageable="stage", sync=True).wait().host_mode == "staged"
        assert np.array_equal(fresh, src), f"staged d2h of {size} B into fresh memory differs"
    dev.free()
