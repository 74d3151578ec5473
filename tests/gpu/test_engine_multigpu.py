"""Relays on real GPUs: copies into one GPU over its own link plus peer GPUs (run on a machine with two
or more NVIDIA GPUs: pytest -m gpu tests/gpu/test_engine_multigpu.py). Data must arrive intact whatever
path carried it, and on a box with peer access the relay paths must really carry chunks."""

from __future__ import annotations

import numpy as np
import pytest

from gpudash.engine import TransferEngine

try:
    import cupy as cp
    import cupyx
except ImportError:  # CI: these tests are deselected (-m 'not gpu') anyway
    cp = cupyx = None

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason="needs CuPy and NVIDIA GPUs")]
MiB = 2**20


@pytest.fixture(scope="module")
def eng(eng: TransferEngine) -> TransferEngine:
    """The shared CUDA engine, on a machine with two or more GPUs (relays need a peer)."""
    if eng.num_gpus < 2:
        pytest.skip("needs two or more GPUs for relay paths")
    return eng


def _relay_bytes(eng: TransferEngine, direction: str, target: int) -> int:
    return sum(p.bytes for p in eng.stats().paths if p.via is not None and p.gpu == target
               and p.direction == direction)


@pytest.mark.parametrize("target", [0, 1])
@pytest.mark.parametrize("size", [64 * MiB + 5, 1024 * MiB])
def test_multipath_copies_are_byte_exact(eng: TransferEngine, target: int, size: int) -> None:
    src = cupyx.empty_pinned((size,), dtype=np.uint8)
    src[:] = np.random.default_rng(size + target).integers(0, 256, size, dtype=np.uint8)
    with cp.cuda.Device(target):
        dev = cp.zeros(size, dtype=cp.uint8)
    before = _relay_bytes(eng, "h2d", target)
    eng.copy(dev, src, sync=True)
    with cp.cuda.Device(target):
        assert bool((dev == cp.asarray(src)).all()), "h2d bytes differ"
    out = cupyx.zeros_pinned((size,), dtype=np.uint8)
    eng.copy(out, dev, sync=True)
    assert np.array_equal(out, src), "d2h bytes differ"
    peers = [v for v in range(eng.num_gpus) if v != target and eng.topology().peer[v][target] is not None]
    relayed = _relay_bytes(eng, "h2d", target) - before
    print(f"target GPU {target}, {size} B: {relayed} B over relays via {peers}")
    if peers and size >= 1024 * MiB:
        assert relayed > 0, "peers can reach the target, yet no chunk took a relay"



def test_relay_buffers_are_blocks_of_the_via_gpus_relay_shard(eng: TransferEngine) -> None:
    topo = eng.topology()
    peers = [v for v in range(1, eng.num_gpus) if topo.peer[v][0] is not None]
    if not peers:
        pytest.skip("no GPU has peer access to GPU 0")
    pools = eng.pools()
    src = cupyx.empty_pinned((1024 * MiB,), dtype=np.uint8)
    src[:] = 3
    with cp.cuda.Device(0):
        dev = cp.zeros(src.nbytes, dtype=cp.uint8)
    peak, before = 0, sum(p.chunks for p in eng.stats().paths if p.via in peers and p.gpu == 0)
    h = eng.copy(dev, src)
    while not h.done():
        peak = max(peak, sum(pools[f"engine-gpu{v}"].shard_stats("relay").used for v in peers))
    h.wait()
    with cp.cuda.Device(0):
        assert int(dev.sum(dtype=cp.uint64)) == 3 * src.nbytes
    relayed = sum(p.chunks for p in eng.stats().paths if p.via in peers and p.gpu == 0) - before
    assert relayed > 0 and peak > 0, "relayed chunks hold blocks of their via GPU's relay shard while in flight"
    for v in peers:
        st = pools[f"engine-gpu{v}"].shard_stats("relay")
        assert (st.used, st.allocations) == (0, 0)
        pools[f"engine-gpu{v}"].check()
