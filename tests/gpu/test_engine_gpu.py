"""The engine's integrity suite through the CUDA backend with CuPy buffers (run on a GPU machine:
pytest -m gpu tests/gpu/test_engine_gpu.py). Self-contained: needs only the engine package and CuPy."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from gpudash.engine import EngineArgumentError, TransferEngine

try:
    import cupy as cp
    import cupyx
except ImportError:  # CI: these tests are deselected (-m 'not gpu') anyway
    cp = cupyx = None

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason="needs CuPy and an NVIDIA GPU")]

MiB = 2**20


def _sizes(rng: np.random.Generator, n: int, hi: int) -> list[int]:
    return [int(x) for x in np.exp(rng.uniform(0, np.log(hi), n)).astype(np.int64).clip(1, hi)]


def test_random_copies_byte_exact_with_cupy_buffers(eng: TransferEngine) -> None:
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            pinned = cupyx.empty_pinned((16 * MiB,), dtype=np.uint8)
            pinned[:] = rng.integers(0, 256, 16 * MiB, dtype=np.uint8)
            pageable = rng.integers(0, 256, 16 * MiB, dtype=np.uint8)
            dev = cp.zeros(16 * MiB + 4096, dtype=cp.uint8)
            out = np.zeros(16 * MiB + 4096, dtype=np.uint8)
            for size in _sizes(rng, 300, 8 * MiB):
                host = pinned if rng.integers(2) else pageable
                so = int(rng.integers(0, 16 * MiB - size + 1))
                do = int(rng.integers(0, 4096)) | 1
                sync = bool(rng.integers(2))  # sync=True: issued and completed on this thread
                eng.copy(dev.data.ptr + do, host[so:so + size], nbytes=size, sync=sync).wait()
                assert np.array_equal(cp.asnumpy(dev[do:do + size]), host[so:so + size]), f"h2d {size} B"
                oo = int(rng.integers(0, 4096)) | 1
                eng.copy(out[oo:oo + size], dev.data.ptr + do, nbytes=size, sync=sync).wait()
                assert np.array_equal(out[oo:oo + size], host[so:so + size]), f"d2h {size} B"
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("size", [1, 4097, 11_300_001, 256 * MiB + 3])
def test_large_and_edge_sizes_with_cupy_arrays(eng: TransferEngine, size: int) -> None:
    src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    dev = cp.empty(size, dtype=cp.uint8)
    info = eng.h2d(dev, src).wait()
    assert info.nbytes == size
    assert np.array_equal(cp.asnumpy(dev), src)
    back = np.empty_like(src)
    eng.d2h(back, dev).wait()
    assert np.array_equal(back, src)
    info = eng.h2d(dev, src).wait()  # reused buffer: registered now
    assert info.host_mode in ("registered", "staged")
    assert np.array_equal(cp.asnumpy(dev), src)
    back[:] = 0
    assert eng.d2h(back, dev, sync=True).wait().host_mode in ("registered", "staged")
    assert np.array_equal(back, src)


def test_stream_order_is_kept(eng: TransferEngine) -> None:
    n = 256 * MiB
    s = cp.cuda.Stream(non_blocking=True)
    host = cupyx.empty_pinned((n,), dtype=np.uint8)
    host[:] = 7
    dev = cp.zeros(n, dtype=cp.uint8)
    with s:
        cp.cuda.runtime.memsetAsync(dev.data.ptr, 0, n, s.ptr)
        h = eng.copy(dev, host, stream=s)  # later work on s must see the copied bytes
        total = dev.sum(dtype=cp.uint64)
    s.synchronize()
    h.wait()
    assert int(total) == 7 * n
    with s:
        dev.fill(9)  # queued before the D2H: the copy must not start before it
        back = np.zeros(n, dtype=np.uint8)
        eng.copy(back, dev, stream=s).wait()
    assert (back == 9).all()


def test_torch_tensors_if_available(eng: TransferEngine) -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    src = torch.arange(1 << 20, dtype=torch.int32).to(torch.uint8)
    eng.h2d(t, src).wait()
    assert torch.equal(t.cpu(), src)


def test_bad_input_on_cuda(eng: TransferEngine) -> None:
    dev = cp.zeros(1000, dtype=cp.uint8)
    with pytest.raises(EngineArgumentError, match="dst is too small"):
        eng.copy(dev, np.zeros(2000, dtype=np.uint8))
    with pytest.raises(EngineArgumentError, match="not contiguous"):
        eng.copy(cp.zeros(2000, dtype=cp.uint8)[::2], np.zeros(1000, dtype=np.uint8))
    with pytest.raises(EngineArgumentError, match="does not exist"):
        eng.alloc_device(eng.num_gpus, 10)
    raw = eng.alloc_device(0, 1000)
    with pytest.raises(EngineArgumentError, match="dst is too small"):
        eng.copy(raw.ptr, np.zeros(4096, dtype=np.uint8), nbytes=4096)  # raw pointer: extent from the driver
    raw.free()
    with pytest.raises(EngineArgumentError, match="freed DeviceBuffer"):
        eng.copy(raw, np.zeros(10, dtype=np.uint8))


def test_stats_count_the_bytes(eng: TransferEngine) -> None:
    before = {lk.gpu: lk.h2d_bytes for lk in eng.stats().links}
    dev = eng.alloc_device(0, 64 * MiB)
    eng.copy(dev, eng.alloc_host(64 * MiB)).wait()
    after = {lk.gpu: lk.h2d_bytes for lk in eng.stats().links}
    # Every byte crosses exactly one host link: GPU 0's own, or a peer's when a relay carried it.
    assert sum(after.values()) - sum(before.values()) == 64 * MiB
    assert after[0] > before[0]
    assert eng.topology().backend == "cuda"
    dev.free()


def test_sync_copies_on_a_stream_keep_its_order(eng: TransferEngine) -> None:
    """A synchronous single-path copy (one driver copy on the caller's stream, or a staged one) sees work
    queued there before it, and later work there sees its bytes."""
    s = cp.cuda.Stream(non_blocking=True)
    dev = cp.zeros(MiB, dtype=cp.uint8)
    back = cupyx.empty_pinned((MiB,), dtype=np.uint8)
    with s:
        dev.fill(3)  # queued, not yet run when the copy is issued
        info = eng.copy(back, dev, stream=s, sync=True).wait()
    assert (info.chunks, info.paths_used, info.host_mode) == (1, 1, "pinned") and (back == 3).all()
    n = 512 * 1024
    src = np.full(n, 5, dtype=np.uint8)  # pageable, first sight, under the staging threshold: one driver copy
    with s:
        assert eng.copy(dev, src, stream=s, sync=True).wait().host_mode == "driver"
        total = dev.sum(dtype=cp.uint64)
    assert int(total) == 5 * n + 3 * (MiB - n)
    big, dev4 = np.full(4 * MiB, 7, dtype=np.uint8), cp.zeros(4 * MiB, dtype=cp.uint8)
    with s:  # over the threshold: staged on the caller's thread, in the stream's order all the same
        dev4.fill(1)
        assert eng.copy(dev4, big, stream=s, sync=True).wait().host_mode == "staged"
        total = dev4.sum(dtype=cp.uint64)
    assert int(total) == 7 * 4 * MiB


def test_repeated_copies_of_the_same_arrays_stay_exact_and_checked(eng: TransferEngine) -> None:
    before = sum(p.bytes for p in eng.stats().paths if p.direction == "h2d")
    for round_ in range(3):  # new arrays each round: addresses (and ids) get reused
        dev = cp.empty(64 * 1024 + round_, dtype=cp.uint8)
        host = cupyx.empty_pinned((dev.size,), dtype=np.uint8)
        for i in range(5):
            host[:] = i + round_
            eng.copy(dev, host, sync=True)
            assert int(dev.sum(dtype=cp.uint64)) == (i + round_) * dev.size
        out = np.zeros(dev.size, dtype=np.uint8)
        eng.copy(out, dev, sync=True)
        out.flags.writeable = False
        with pytest.raises(EngineArgumentError, match="dst is read-only"):
            eng.copy(out, dev, sync=True)
    after = sum(p.bytes for p in eng.stats().paths if p.direction == "h2d")
    assert after - before == sum(5 * (64 * 1024 + r) for r in range(3))  # the fast path counts its bytes
