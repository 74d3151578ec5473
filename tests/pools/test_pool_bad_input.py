"""Every bad input raises a clear error naming the argument; nothing crashes, nothing changes."""

from __future__ import annotations

import pytest

from gpudash.engine import EngineArgumentError, EngineError
from gpudash.engine.pools import MemoryPool, PoolBlock


@pytest.mark.parametrize("nbytes,match", [
    (0, r"nbytes=0 is out of range"),
    (-5, r"nbytes=-5 is out of range"),
    (1 << 70, r"nbytes=\d+ is out of range"),
    (2.5, r"nbytes must be an integer number of bytes, got 2.5"),
    ("1MiB", r"nbytes must be an integer"),
    (True, r"nbytes must be an integer"),
    (None, r"nbytes must be an integer"),
])
def test_bad_sizes(pool: MemoryPool, nbytes: object, match: str) -> None:
    with pytest.raises(EngineArgumentError, match=match):
        pool.alloc("a", nbytes)  # type: ignore[arg-type]
    assert pool.shard_stats("a").used == 0 and pool.shard_stats("a").failures == 0


def test_absurd_but_valid_size_is_a_pool_refusal(pool: MemoryPool) -> None:
    with pytest.raises(MemoryError, match=r"shard 'a' of pool 'host' cannot fit 4611686018427387904 bytes"):
        pool.alloc("a", 1 << 62)


@pytest.mark.parametrize("align,match", [(3, "align=3 must be a power of two"), (0, "align=0 is out of range"),
                                         (-256, "out of range"), (1 << 31, "out of range"), ("x", "integer")])
def test_bad_alignment(pool: MemoryPool, align: object, match: str) -> None:
    with pytest.raises(EngineArgumentError, match=match):
        pool.alloc("a", 64, align=align)  # type: ignore[arg-type]


def test_unknown_shard(pool: MemoryPool) -> None:
    for call in (lambda: pool.alloc("nope", 1), lambda: pool.resize("nope", 1024),
                 lambda: pool.shard_stats("nope"), lambda: pool.remove_shard("nope")):
        with pytest.raises(EngineArgumentError, match=r"shard='nope' does not exist in pool 'host' \(shards: a, b\)"):
            call()
    with pytest.raises(EngineArgumentError, match=r"shard=\['a'\] does not exist"):
        pool.alloc(["a"], 1)  # type: ignore[arg-type]


def test_double_free(pool: MemoryPool) -> None:
    blk = pool.alloc("a", 100)
    pool.free(blk)
    with pytest.raises(EngineArgumentError, match=r"ptr=0x[0-9a-f]+ is not a live allocation of pool 'host': already freed"):
        pool.free(blk)
    pool.check()


def test_interior_and_foreign_pointers(pool: MemoryPool) -> None:
    blk = pool.alloc("a", 4096)
    with pytest.raises(EngineArgumentError, match="not the start of a block"):
        pool.free(blk.ptr + 256)
    with pytest.raises(EngineArgumentError, match=r"is not inside pool 'host' \(slab 0x"):
        pool.free(blk.ptr + (16 << 20))
    with pytest.raises(EngineArgumentError, match="is not inside pool"):
        pool.free(0)
    with pytest.raises(EngineArgumentError, match=r"ptr=-1 is out of range"):
        pool.free(-1)
    with MemoryPool(1 << 16, name="other", shards={"x": 1 << 16}) as other:
        theirs = other.alloc("x", 64)
        with pytest.raises(EngineArgumentError, match="block belongs to pool 'other', not 'host'"):
            pool.free(theirs)
        with pytest.raises(EngineArgumentError, match="is not inside pool 'host'"):
            pool.free(theirs.ptr)
        forged = PoolBlock(theirs.ptr, 64, "x", "host")
        with pytest.raises(EngineArgumentError, match="is not inside pool 'host'"):
            pool.free(forged)
    assert pool.shard_stats("a").allocations == 1
    pool.free(blk)
    pool.check()


@pytest.mark.parametrize("capacity,match", [(0, "capacity=0 is out of range"), (-1, "out of range"),
                                            (1.5, "capacity must be an integer")])
def test_bad_capacities(pool: MemoryPool, capacity: object, match: str) -> None:
    with pytest.raises(EngineArgumentError, match=match):
        pool.resize("a", capacity)  # type: ignore[arg-type]
    with pytest.raises(EngineArgumentError, match=match):
        pool.add_shard("c", capacity)  # type: ignore[arg-type]
    assert pool.shards == ("a", "b") and pool.shard_stats("a").capacity == 256 << 10


@pytest.mark.parametrize("name", ["", 3, None, "x" * 65])
def test_bad_shard_names(pool: MemoryPool, name: object) -> None:
    with pytest.raises(EngineArgumentError, match="shard name must be a non-empty string"):
        pool.add_shard(name, 1024)  # type: ignore[arg-type]


def test_duplicate_shard(pool: MemoryPool) -> None:
    with pytest.raises(EngineArgumentError, match="shard 'a' already exists in pool 'host'; resize"):
        pool.add_shard("a", 1024)


def test_bad_pool_arguments() -> None:
    with pytest.raises(EngineArgumentError, match="nbytes=0 is out of range"):
        MemoryPool(0)
    with pytest.raises(EngineArgumentError, match="granule=100 must be a power of two"):
        MemoryPool(1 << 20, granule=100)
    with pytest.raises(EngineArgumentError, match="policy='worst' is unknown; use one of best, banded"):
        MemoryPool(1 << 20, policy="worst")
    with pytest.raises(EngineArgumentError, match="gpu= needs an engine"):
        MemoryPool(1 << 20, gpu=0)
    with pytest.raises(EngineError, match="cannot add shard 'big' of 2097152 bytes"):
        MemoryPool(1 << 20, shards={"big": 2 << 20})


def test_closed_pool(pool: MemoryPool) -> None:
    blk = pool.alloc("a", 64)
    pool.close()
    pool.close()  # idempotent
    for call in (lambda: pool.alloc("a", 64), lambda: pool.free(blk), lambda: pool.resize("a", 4096),
                 lambda: pool.check(), lambda: pool.unassigned):
        with pytest.raises(EngineError, match="pool 'host' is closed"):
            call()


def test_bad_trace_slot_reuse(pool: MemoryPool) -> None:
    import numpy as np

    from gpudash.engine.traces import Trace

    t = Trace(np.array([0, 0], np.int32), np.array([0, 0], np.int32), np.array([64, 64], np.uint64),
              np.array([3, 3], np.uint32), ("a",), {"a": 1 << 18})
    with pytest.raises(EngineError, match="trace reuses slot 3 at op 1 while it is live"):
        pool.replay(t)
    pool.check()
    bad = Trace(t.op, t.shard, t.size, t.slot, ("zz",), {"zz": 1})
    with pytest.raises(EngineArgumentError, match="shard='zz' does not exist"):
        pool.replay(bad)


@pytest.mark.parametrize("column,value,match", [
    ("op", [0, 2], "must hold only 0 .alloc. and 1 .free."),
    ("shard", [0, 5], "must index its 1 shard names"),
    ("slot", [0, -1], r"slot numbers in \[0, 2\*\*31\)"),
    ("size", [64], "column 'size' has shape .1,.; every column must be 1-D with 2 entries"),
])
def test_bad_trace_columns(pool: MemoryPool, column: str, value: list, match: str) -> None:
    import numpy as np

    from gpudash.engine.traces import Trace

    cols = {"op": [0, 1], "shard": [0, 0], "size": [64, 0], "slot": [0, 0]}
    cols[column] = value
    t = Trace(*(np.array(cols[k]) for k in ("op", "shard", "size", "slot")), ("a",), {"a": 1 << 18})
    with pytest.raises(EngineArgumentError, match=match):
        pool.replay(t)
    pool.check()
