"""Shards resized while in use, isolation between shards, adding and removing shards."""

from __future__ import annotations

import pytest

from gpudash.engine.pools import MemoryPool, PoolError, PoolExhaustedError

KiB = 1024


def test_full_shard_never_borrows_from_its_neighbour(pool: MemoryPool) -> None:
    blocks = [pool.alloc("a", 64 * KiB) for _ in range(4)]
    with pytest.raises(PoolExhaustedError) as e:
        pool.alloc("a", 1)
    msg = str(e.value)
    assert "shard 'a'" in msg and "1 bytes" in msg and "largest free block is 0 bytes" in msg
    assert e.value.shard == "a" and e.value.largest_free == 0
    assert pool.shard_stats("b").used == 0 and pool.shard_stats("a").failures == 1
    pool.free(blocks[1])
    pool.free(blocks[2])  # merges with its free neighbour
    st = pool.shard_stats("a")
    assert (st.free_blocks, st.largest_free, st.fragmentation) == (1, 128 * KiB, 0.0)
    with pytest.raises(PoolExhaustedError, match="largest free block is 131072 bytes"):
        pool.alloc("a", 129 * KiB)
    pool.check()


def test_fragmentation_value(pool: MemoryPool) -> None:
    blocks = [pool.alloc("a", 32 * KiB) for _ in range(8)]
    for b in blocks[::2]:
        pool.free(b)  # four separate 32 KiB holes
    st = pool.shard_stats("a")
    assert (st.free, st.free_blocks, st.largest_free) == (128 * KiB, 4, 32 * KiB)
    assert st.fragmentation == pytest.approx(0.75)
    pool.check()


def test_grow_while_in_use_extends_in_place(pool: MemoryPool) -> None:
    # 'b' sits right after 'a'; 'b' grows into the unassigned space after it
    live = [pool.alloc("b", 100 * KiB) for _ in range(2)]
    pool.resize("b", 512 * KiB)
    st = pool.shard_stats("b")
    assert (st.capacity, st.used, st.extents) == (512 * KiB, 200 * KiB, 1)
    assert st.free_blocks == 1, "the new space merged with the free tail"
    big = pool.alloc("b", 300 * KiB)
    for b in [*live, big]:
        pool.free(b)
    pool.check()


def test_grow_takes_a_second_extent_when_not_adjacent(pool: MemoryPool) -> None:
    keep = pool.alloc("a", 10 * KiB)
    pool.resize("a", 384 * KiB)  # 'b' follows 'a', so the extra 128 KiB come from elsewhere
    st = pool.shard_stats("a")
    assert (st.capacity, st.extents, st.free_blocks) == (384 * KiB, 2, 2)
    assert st.fragmentation == pytest.approx(1 - (246 * KiB) / (374 * KiB))
    blk = pool.alloc("a", 128 * KiB)
    lo, hi = pool.base, pool.base + 256 * KiB
    assert not lo <= blk.ptr < hi or blk.ptr + 128 * KiB <= hi
    pool.free(blk)
    pool.free(keep)
    pool.check()


def test_grow_beyond_the_slab_is_refused_and_changes_nothing(pool: MemoryPool) -> None:
    with pytest.raises(PoolError, match=r"cannot grow shard 'a' .* only 524288 bytes of the slab are unassigned"):
        pool.resize("a", 2 << 20)
    assert pool.shard_stats("a").capacity == 256 * KiB and pool.unassigned == 512 * KiB
    pool.check()


def test_shrink_only_into_free_space_at_the_end(pool: MemoryPool) -> None:
    first = pool.alloc("a", 64 * KiB)
    second = pool.alloc("a", 64 * KiB)  # ends at 128 KiB; 128 KiB free after it
    with pytest.raises(PoolError) as e:
        pool.resize("a", 64 * KiB)
    assert "only 131072 bytes at its end are free" in str(e.value)
    assert "shrink to at least 131072 bytes" in str(e.value)
    assert pool.shard_stats("a").capacity == 256 * KiB, "a refused shrink changes nothing"
    pool.resize("a", 128 * KiB)  # exactly the free tail
    st = pool.shard_stats("a")
    assert (st.capacity, st.free, st.used) == (128 * KiB, 0, 128 * KiB)
    assert pool.unassigned == 640 * KiB
    pool.free(first)
    with pytest.raises(PoolError, match="only 0 bytes at its end are free"):
        pool.resize("a", 64 * KiB)  # the free space is at the start, not the end
    pool.free(second)
    pool.resize("a", 64 * KiB)
    assert pool.shard_stats("a").capacity == 64 * KiB
    pool.check()


def test_shrink_across_extents(pool: MemoryPool) -> None:
    pool.resize("a", 384 * KiB)  # two extents, both free
    pool.resize("a", 100 * KiB)  # gives back all of the second extent and part of the first
    st = pool.shard_stats("a")
    assert (st.capacity, st.extents, st.free_blocks) == (100 * KiB, 1, 1)
    assert pool.unassigned == 1024 * KiB - 100 * KiB - 256 * KiB
    pool.check()


def test_resize_rounds_to_the_granule(pool: MemoryPool) -> None:
    pool.resize("a", 1000)
    assert pool.shard_stats("a").capacity == 1024


def test_add_and_remove_shards(pool: MemoryPool) -> None:
    pool.add_shard("c", 512 * KiB)
    assert pool.shards == ("a", "b", "c") and pool.unassigned == 0
    with pytest.raises(PoolError, match="only 0 bytes of its 1048576-byte slab are unassigned"):
        pool.add_shard("d", 1)
    blk = pool.alloc("c", 1)
    with pytest.raises(PoolError, match="still holds 1 live allocation"):
        pool.remove_shard("c")
    pool.free(blk)
    pool.remove_shard("c")
    assert pool.shards == ("a", "b") and pool.unassigned == 512 * KiB
    pool.add_shard("c", 128 * KiB)
    pool.check()


def test_alignment_honoured_and_padding_stays_free(pool: MemoryPool) -> None:
    small = pool.alloc("a", 256)
    blk = pool.alloc("a", 1000, align=64 * KiB)
    assert blk.ptr % (64 * KiB) == 0
    assert pool.size_of(blk) == ("a", 1024)
    st = pool.shard_stats("a")
    assert st.used == 256 + 1024 and st.used + st.free == st.capacity
    pool.free(small)
    pool.free(blk)
    assert pool.shard_stats("a").free_blocks == 1
    pool.check()


def test_stats_and_close(pool: MemoryPool) -> None:
    stats = pool.stats()
    assert [s.shard for s in stats] == ["a", "b"] and all(s.pool == "host" for s in stats)
    assert pool.label == "heap" and "heap host" in repr(pool)
    pool.close()
    assert pool.stats() == () and pool.closed


def test_resize_while_other_threads_allocate() -> None:
    """Four threads allocate and free in 'a' and 'b' while the main thread grows and shrinks both."""
    import threading

    import numpy as np

    pool = MemoryPool(8 << 20, shards={"a": 2 << 20, "b": 2 << 20})
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn(shard: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        live: list = []
        try:
            while not stop.is_set():
                if live and rng.random() < 0.5:
                    pool.free(live.pop(int(rng.integers(len(live)))))
                else:
                    try:
                        live.append(pool.alloc(shard, int(rng.integers(1, 64 * KiB))))
                    except PoolExhaustedError:
                        pass
            for b in live:
                pool.free(b)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(s, i)) for i, s in enumerate("abab")]
    for t in threads:
        t.start()
    done = 0
    rng = np.random.default_rng(9)
    for _ in range(400):
        shard = "ab"[int(rng.integers(2))]
        try:
            pool.resize(shard, int(rng.integers(1, 4)) << 20)
            done += 1
        except PoolError:  # a shrink over live blocks, or a grow beyond the slab: nothing changed
            pass
        pool.check()
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert done > 0
    for s in pool.stats():
        assert s.used == 0 and s.free == s.capacity and s.free_blocks >= 1
    pool.check()
    pool.close()
