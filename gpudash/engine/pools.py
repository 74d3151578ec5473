"""Memory pools split into named shards (data plane in csrc/pool.cpp, through gpudash/engine/_native.py).

A pool is one slab: pinned host memory or one device allocation per GPU, both taken from a
TransferEngine (cuMemHostAlloc / cuMemAlloc on the CUDA backend; host memory standing in for a GPU on
the sim backend, labelled ``sim``), or plain process memory (label ``heap``) for tests and benchmarks.
The slab is split into shards; an allocation is placed inside its own shard (policy "banded": the
lowest-addressed block up to 4x the request, else the smallest that fits), never borrows from
another, and a failure names the shard, the request and the largest free block. Shards grow and
shrink while in use (shrink only into free space at their end).

    pools = engine_pools(eng, host_bytes=1 << 30, device_bytes=8 << 30, shards={"kv": 0.75, "staging": 0.25})
    blk = pools["gpu0"].alloc("kv", 2 << 20)
    pools["gpu0"].free(blk)
"""

from __future__ import annotations

import ctypes
import operator
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gpudash.engine import _native as N
from gpudash.engine.errors import EngineArgumentError, EngineError
from gpudash.engine.traces import Trace, replay_columns

MAX_BYTES = 1 << 62
MAX_ALIGN = 1 << 30
DEFAULT_GRANULE = 256  # cuMemAlloc hands out 256-byte aligned memory; every block is a multiple
# How a shard picks among free blocks that fit (csrc/gpudash_pool.h): "best" = the smallest;
# "banded" = the lowest address among blocks up to 4x the request, else the smallest.
POLICIES = {"best": 0, "banded": 1}


class PoolError(EngineError):
    """A pool refused a shard change (shrink over live allocations, grow beyond the slab, remove busy)."""


class PoolExhaustedError(PoolError, MemoryError):
    """An allocation did not fit its shard; `shard`, `nbytes`, `largest_free` say why."""

    def __init__(self, message: str, shard: str, nbytes: int, largest_free: int):
        super().__init__(message, N.ENOMEM, "GE_ENOMEM")
        self.shard = shard
        self.nbytes = nbytes
        self.largest_free = largest_free


@dataclass(frozen=True, slots=True)
class ShardStats:
    """One shard now. `used` counts whole blocks (requests rounded up to the pool's granule);
    fragmentation is 1 - largest_free / free (0 when nothing is free)."""

    pool: str
    shard: str
    capacity: int
    used: int
    free: int
    largest_free: int
    free_blocks: int
    fragmentation: float
    failures: int
    allocations: int
    extents: int


class PoolBlock(NamedTuple):
    """One live allocation: `ptr` is a raw address in the pool's slab (device memory for a GPU pool).
    A named tuple, not a dataclass: it is made on every alloc() and tuples are cheapest to build."""

    ptr: int
    nbytes: int
    shard: str
    pool: str


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a native trace replay did; `seconds` covers the replay loop only (no Python inside)."""

    ops: int
    allocs: int
    frees: int
    failures: int
    checks: int
    seconds: float
    peak_fragmentation: float
    peak_used: int
    mean_fragmentation: float = 0.0

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else float("inf")

    @property
    def pairs_per_s(self) -> float:
        """Alloc+free pairs per second (a pair is two ops)."""
        return self.ops_per_s / 2


def _int(value: Any, arg: str, lo: int, hi: int) -> int:
    """`value` as an int in [lo, hi], else EngineArgumentError naming `arg`."""
    n = None if isinstance(value, bool) else value
    try:
        n = operator.index(n)
    except TypeError:
        raise EngineArgumentError(f"{arg} must be an integer number of bytes, got {value!r}") from None
    if not lo <= n <= hi:
        raise EngineArgumentError(f"{arg}={n} is out of range; it must be between {lo} and {hi}")
    return n


def _pow2(value: Any, arg: str) -> int:
    n = _int(value, arg, 1, MAX_ALIGN)
    if n & (n - 1):
        raise EngineArgumentError(f"{arg}={n} must be a power of two (e.g. 256, 4096)")
    return n


class MemoryPool:
    """One slab split into named shards. Thread-safe (the C layer holds a lock per call).

    engine=None: process memory (label ``heap``); with an engine: `gpu` None for pinned host memory,
    else device memory on that GPU (label ``sim`` or ``cuda`` after the engine's backend).
    """

    def __init__(self, nbytes: int, *, engine: Any = None, gpu: int | None = None, name: str | None = None,
                 granule: int = DEFAULT_GRANULE, shards: dict[str, int] | None = None, policy: str = "banded"):
        if policy not in POLICIES:
            raise EngineArgumentError(f"policy={policy!r} is unknown; use one of {', '.join(POLICIES)}")
        self.policy = policy
        self.granule = _pow2(granule, "granule")
        nbytes = _int(nbytes, "nbytes", 1, MAX_BYTES)
        self.nbytes = -(-nbytes // self.granule) * self.granule
        self.gpu = gpu
        self.label = "heap" if engine is None else engine.backend
        self.kind = "device" if gpu is not None else "host"
        if engine is None and gpu is not None:
            raise EngineArgumentError("gpu= needs an engine (device memory comes from TransferEngine.alloc_device)")
        default = f"gpu{gpu}" if gpu is not None else "host"
        self.name = name or (default if self.label != "sim" else f"sim-{default}")
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}
        self._slab: Any = None
        self._engine = engine  # its memory holds the slab: the pool refuses work once it closes
        if engine is None:
            self._slab = np.empty(self.nbytes + self.granule, dtype=np.uint8)
            base = -(-self._slab.ctypes.data // self.granule) * self.granule
        elif gpu is None:
            self._slab = engine.alloc_host(self.nbytes)
            base = self._slab.ptr
        else:
            self._slab = engine.alloc_device(gpu, self.nbytes)
            base = self._slab.ptr
        self.base = base
        ptr = ctypes.c_void_p()
        rc = N.lib().gp_pool_create(base, self.nbytes, self.granule, ctypes.byref(ptr))
        if rc != N.OK:
            self._release_slab()
            N.check(rc, f"creating pool {self.name!r} over {self.nbytes} bytes (granule {self.granule})")
        self._bind(ptr)
        N.check(self._lib.gp_pool_set_policy(self._ptr, POLICIES[policy]), f"setting policy {policy!r}")
        for shard, cap in (shards or {}).items():
            self.add_shard(shard, cap)

    def _bind(self, ptr: ctypes.c_void_p) -> None:
        """Use the native pool `ptr` (the C calls and out-parameters every alloc/free reuses)."""
        self._lib = N.lib()
        self._ptr = ptr
        self._out, self._detail, self._owner = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_int()
        self._out_ref, self._detail_ref = ctypes.byref(self._out), ctypes.byref(self._detail)
        self._owner_ref = ctypes.byref(self._owner)
        self._alloc, self._free = self._lib.gp_alloc, self._lib.gp_free

    # ---- lifecycle ------------------------------------------------------------------------
    def _release_slab(self) -> None:
        slab, self._slab = self._slab, None
        if slab is not None and hasattr(slab, "free"):
            slab.free()

    @property
    def closed(self) -> bool:
        return not self._ptr

    def close(self) -> None:
        """Drop every allocation and give the slab back to the engine (before the engine closes)."""
        with self._lock:
            if self._ptr:
                self._lib.gp_pool_destroy(self._ptr)
                self._ptr = ctypes.c_void_p()
                self._ids.clear()
                self._release_slab()

    def __enter__(self) -> "MemoryPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> ctypes.c_void_p:
        if not self._ptr:
            raise EngineError(f"pool {self.name!r} is closed; create a new MemoryPool", N.ECLOSED, "GE_ECLOSED")
        if self._engine is not None and self._engine.closed:
            raise EngineError(f"pool {self.name!r} is closed with the engine whose memory it holds; close pools "
                              f"before their engine", N.ECLOSED, "GE_ECLOSED")
        return self._ptr

    def _id(self, shard: Any) -> int:
        try:
            return self._ids[shard]
        except (KeyError, TypeError):
            self._open()
            names = ", ".join(self._ids) or "none yet"
            raise EngineArgumentError(f"shard={shard!r} does not exist in pool {self.name!r} (shards: {names}); "
                                      f"add it with add_shard()") from None

    # ---- shards -----------------------------------------------------------------------------
    @property
    def shards(self) -> tuple[str, ...]:
        return tuple(self._ids)

    @property
    def unassigned(self) -> int:
        """Slab bytes no shard owns (room for new shards and for growing)."""
        with self._lock:  # close() cannot free the pool between the check and the call
            return int(self._lib.gp_pool_unassigned(self._open()))

    def add_shard(self, shard: str, capacity: int) -> None:
        """A new shard of `capacity` bytes (rounded up to the granule) from unassigned slab."""
        if not isinstance(shard, str) or not shard or len(shard) > 64:
            raise EngineArgumentError(f"shard name must be a non-empty string of at most 64 characters, got {shard!r}")
        capacity = _int(capacity, "capacity", 1, MAX_BYTES)
        with self._lock:
            ptr = self._open()
            if shard in self._ids:
                raise EngineArgumentError(f"shard {shard!r} already exists in pool {self.name!r}; resize() it instead")
            sid, detail = ctypes.c_int(), ctypes.c_uint64()
            rc = self._lib.gp_shard_add(ptr, capacity, ctypes.byref(sid), ctypes.byref(detail))
            if rc == N.ENOMEM:
                raise PoolError(f"cannot add shard {shard!r} of {capacity} bytes to pool {self.name!r}: only "
                                f"{detail.value} bytes of its {self.nbytes}-byte slab are unassigned; shrink or "
                                f"remove another shard", rc, "GE_ENOMEM")
            N.check(rc, f"adding shard {shard!r}")
            self._ids[shard] = sid.value

    def remove_shard(self, shard: str) -> None:
        """Give an empty shard's space back to the slab; refused while it has live allocations."""
        with self._lock:
            ptr, sid, detail = self._open(), self._id(shard), ctypes.c_uint64()
            rc = self._lib.gp_shard_remove(ptr, sid, ctypes.byref(detail))
            if rc == N.EBUSY:
                raise PoolError(f"cannot remove shard {shard!r} of pool {self.name!r}: it still holds "
                                f"{detail.value} live allocation(s); free them first", rc, "GE_EBUSY")
            N.check(rc, f"removing shard {shard!r}")
            del self._ids[shard]

    def resize(self, shard: str, capacity: int) -> None:
        """Set a shard's capacity while it is in use: growing takes unassigned slab; shrinking only gives
        back free space at the shard's end. A refusal changes nothing and says how far it could go."""
        capacity = _int(capacity, "capacity", 1, MAX_BYTES)
        with self._lock:
            ptr, sid, detail = self._open(), self._id(shard), ctypes.c_uint64()
            old = self._stats_c(sid).capacity
            rc = self._lib.gp_shard_resize(ptr, sid, capacity, ctypes.byref(detail))
            if rc == N.ENOMEM:
                raise PoolError(f"cannot grow shard {shard!r} of pool {self.name!r} from {old} to {capacity} bytes: "
                                f"only {detail.value} bytes of the slab are unassigned; shrink or remove another "
                                f"shard, or make the pool larger", rc, "GE_ENOMEM")
            if rc == N.EBUSY:
                raise PoolError(f"cannot shrink shard {shard!r} of pool {self.name!r} from {old} to {capacity} "
                                f"bytes: only {detail.value} bytes at its end are free (live allocations sit "
                                f"before them); free those or shrink to at least {old - detail.value} bytes",
                                rc, "GE_EBUSY")
            N.check(rc, f"resizing shard {shard!r}")

    def _stats_c(self, sid: int) -> N.PoolShardStatsC:
        raw = N.PoolShardStatsC()
        N.check(self._lib.gp_stats(self._open(), sid, ctypes.byref(raw)), "reading shard stats")
        return raw

    def shard_stats(self, shard: str) -> ShardStats:
        with self._lock:
            return self._build(shard, self._stats_c(self._id(shard)))

    def stats(self) -> tuple[ShardStats, ...]:
        """Every shard, in the order they were added."""
        with self._lock:
            if not self._ptr:
                return ()
            return tuple(self._build(s, self._stats_c(i)) for s, i in self._ids.items())

    def _build(self, shard: str, r: N.PoolShardStatsC) -> ShardStats:
        return ShardStats(self.name, shard, r.capacity, r.used, r.free, r.largest_free, r.free_blocks,
                          r.fragmentation, r.failures, r.allocations, r.extents)

    # ---- allocation -------------------------------------------------------------------------
    def alloc(self, shard: str, nbytes: int, align: int | None = None) -> PoolBlock:
        """A block of at least `nbytes` in `shard` (placed by the pool's policy), aligned to `align` (default: the granule).
        PoolExhaustedError when nothing in that shard fits; other shards are never touched."""
        sid = self._id(shard)
        n = nbytes if type(nbytes) is int and 0 < nbytes <= MAX_BYTES else _int(nbytes, "nbytes", 1, MAX_BYTES)
        a = 0 if align is None else _pow2(align, "align")
        with self._lock:  # the out-parameters are shared by every call
            rc = self._alloc(self._open(), sid, n, a, self._out_ref, self._detail_ref)
            ptr, largest = self._out.value, self._detail.value
        if rc == N.OK:
            return PoolBlock(ptr, n, shard, self.name)
        if rc == N.ENOMEM:
            s = self.shard_stats(shard)
            raise PoolExhaustedError(
                f"shard {shard!r} of pool {self.name!r} cannot fit {n} bytes (align {a or self.granule}): its "
                f"largest free block is {largest} bytes ({s.free} of {s.capacity} free, fragmentation "
                f"{s.fragmentation:.2f}); free blocks there or grow it with resize()", shard, n, largest)
        N.check(rc, f"allocating {n} bytes in shard {shard!r}")
        raise AssertionError("unreachable")

    def free(self, block: PoolBlock | int) -> None:
        """Return a block (or the raw pointer alloc() gave) to its shard."""
        if isinstance(block, PoolBlock):
            if block.pool != self.name:
                raise EngineArgumentError(f"block belongs to pool {block.pool!r}, not {self.name!r}; free it there")
            ptr = block.ptr
        else:
            ptr = _int(block, "ptr", 0, (1 << 64) - 1)
        with self._lock:
            rc = self._free(self._open(), ptr, self._owner_ref)
        if rc == N.ERANGE:
            raise EngineArgumentError(f"ptr={ptr:#x} is not inside pool {self.name!r} (slab {self.base:#x}.."
                                      f"{self.base + self.nbytes:#x}); free it with the allocator that gave it")
        if rc == N.EFREED:
            raise EngineArgumentError(f"ptr={ptr:#x} is not a live allocation of pool {self.name!r}: already freed, "
                                      f"or not the start of a block alloc() returned")
        N.check(rc, f"freeing {ptr:#x}")

    def size_of(self, block: PoolBlock | int) -> tuple[str, int]:
        """(shard, block bytes) of a live allocation."""
        ptr = block.ptr if isinstance(block, PoolBlock) else _int(block, "ptr", 0, (1 << 64) - 1)
        size, sid = ctypes.c_uint64(), ctypes.c_int()
        with self._lock:
            rc = self._lib.gp_lookup(self._open(), ptr, ctypes.byref(size), ctypes.byref(sid))
            names = {i: s for s, i in self._ids.items()}
        if rc in (N.ERANGE, N.EFREED):
            raise EngineArgumentError(f"ptr={ptr:#x} is not a live allocation of pool {self.name!r}")
        N.check(rc, "looking up a block")
        return names[sid.value], size.value

    def check(self) -> None:
        """Walk the pool's structures and raise EngineError naming the first broken invariant."""
        msg = ctypes.create_string_buffer(256)
        with self._lock:
            rc = self._lib.gp_check(self._open(), msg, len(msg))
        if rc != N.OK:
            raise EngineError(f"pool {self.name!r} is inconsistent: {msg.value.decode()}", rc, "GE_EINVAL")

    def replay(self, trace: Trace, *, check_every: int = 0, sample_every: int = 0) -> ReplayResult:
        """Run `trace` inside the native library (no Python per op); its shard names must exist here.
        check_every=k runs check() every k ops (1: after every op); sample_every=k samples fragmentation."""
        op, size, slot, align = replay_columns(trace)
        ids = np.array([self._id(s) for s in trace.shards], dtype=np.int32)
        shard = np.ascontiguousarray(ids[trace.shard])
        out, msg = N.PoolReplayC(), ctypes.create_string_buffer(256)
        with self._lock:
            rc = self._lib.gp_replay(self._open(), len(op), op.ctypes.data, shard.ctypes.data, size.ctypes.data,
                                     None if align is None else align.ctypes.data, slot.ctypes.data,
                                     _int(check_every, "check_every", 0, 1 << 62),
                                     _int(sample_every, "sample_every", 0, 1 << 62), ctypes.byref(out), msg, len(msg))
        if rc != N.OK:
            where = f" at op {out.failed_at}" if out.failed_at >= 0 else ""
            raise EngineError(f"replay on pool {self.name!r} failed{where}: {msg.value.decode() or N.error_name(rc)}",
                              rc, N.error_name(rc))
        return ReplayResult(len(trace), out.allocs, out.frees, out.failures, out.checks, out.seconds,
                            out.peak_fragmentation, out.peak_used, out.mean_fragmentation)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.nbytes} bytes, {len(self._ids)} shard(s)"
        return f"MemoryPool({self.name!r}, {self.label} {self.kind}, {state})"


class EnginePool(MemoryPool):
    """One of the engine's own pools (TransferEngine.pools()): ``engine-host``, pinned memory whose
    ``staging`` shard holds the staging ring's slots, or ``engine-gpuN``, device memory whose ``relay``
    shard holds the relay buffers of the paths through GPU N. Chunks take blocks while they are in
    flight, so the stats show what copies use now. The engine sizes the shard from its knobs and owns
    the memory: shards cannot be added or removed, a resize may only grow the shard or shrink it down to
    what the knobs need, and close() only detaches this view (the engine frees the pool when it closes).
    """

    def __init__(self, engine: Any, which: int, raw: tuple[ctypes.c_void_p, int, int, int, int]):
        ptr, sid, base, size, granule = raw
        self._engine, self._which = engine, which
        self.policy, self.granule, self.nbytes, self.base = "banded", granule, size, base
        self.gpu = None if which < 0 else which
        self.label = engine.backend
        self.kind = "host" if which < 0 else "device"
        self.name = "engine-host" if which < 0 else f"engine-gpu{which}"
        self._lock = threading.Lock()
        self._ids = {"staging" if which < 0 else "relay": sid}
        self._slab = None
        self._bind(ptr)

    def close(self) -> None:
        """Detach this view; the pool and its memory stay the engine's."""
        with self._lock:
            self._ptr = ctypes.c_void_p()
            self._ids.clear()

    def add_shard(self, shard: str, capacity: int) -> None:
        raise PoolError(f"pool {self.name!r} belongs to the transfer engine; its one shard follows the engine's "
                        f"knobs, so shards cannot be added there (make a MemoryPool for your own)", N.EBUSY, "GE_EBUSY")

    def remove_shard(self, shard: str) -> None:
        raise PoolError(f"pool {self.name!r} belongs to the transfer engine; its shard {shard!r} cannot be removed",
                        N.EBUSY, "GE_EBUSY")

    def resize(self, shard: str, capacity: int) -> None:
        """Grow the shard, or shrink it no lower than what the engine's knobs need (else PoolError)."""
        self._id(shard)
        capacity = _int(capacity, "capacity", 1, MAX_BYTES)
        need = self._engine._pool_floor(self._which)
        if capacity < need:
            raise PoolError(f"cannot shrink shard {shard!r} of pool {self.name!r} to {capacity} bytes: the engine's "
                            f"knobs (chunk sizes x outstanding or staging slots) have needed {need} bytes there, and "
                            f"copies may still use them; keep at least {need} bytes", N.EBUSY, "GE_EBUSY")
        super().resize(shard, capacity)


def engine_pools(engine: Any, *, host_bytes: int, device_bytes: int,
                 shards: dict[str, float]) -> dict[str, MemoryPool]:
    """A pinned host pool and a device pool per GPU of `engine`, each split by `shards` (fractions of
    the pool, summing to at most 1). Close the pools before the engine."""
    if not shards or any(not 0 < f <= 1 for f in shards.values()) or sum(shards.values()) > 1 + 1e-9:
        raise EngineArgumentError(f"shards must map names to fractions in (0, 1] adding up to at most 1, got {shards!r}")
    made: dict[str, MemoryPool] = {}
    try:
        specs: list[tuple[int | None, int]] = [(None, host_bytes)] + [(g, device_bytes) for g in range(engine.num_gpus)]
        for gpu, size in specs:
            pool = MemoryPool(size, engine=engine, gpu=gpu)
            made[pool.name] = pool
            for name, frac in shards.items():
                pool.add_shard(name, max(pool.granule, int(pool.nbytes * frac) // pool.granule * pool.granule))
    except Exception:
        for pool in made.values():
            pool.close()
        raise
    return made
