"""The contract with a process running under libgpudash_preload.so: where the library is, the
environment that starts it, and the two shared-memory blocks it creates (ctypes mirror of
csrc/preload/gpudash_preload_shm.h; tests/preload_app keeps the two layouts equal).

Environment the preloaded process reads:
  GPUDASH_PRELOAD=off          pass every copy through (the kill switch)
  GPUDASH_PRELOAD_NAME         the server's name, copied into the stats block
  GPUDASH_PRELOAD_KNOBS        start-up knobs, ``name=integer`` pairs joined by commas, e.g.
                               ``h2d_chunk_bytes=2810000,direct_first=1,staging_threads=8``; knobs left
                               out keep the library's own defaults

Both blocks use a sequence lock (`seq` odd while its writer writes). The stats block is written by the
process and only read here; the knob block is written here (under an flock, so two gpudash processes
never interleave) and read by the process, which writes only its `rejected_generation` word.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import re
import struct
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from gpudash.engine import _native as N
from gpudash.engine.config import KNOB_TABLE, validate_knobs
from gpudash.engine.errors import EngineArgumentError, EngineError
from gpudash.engine.results import LinkStats, PathStats
from gpudash.engine.transfer import path_name

PRELOAD_LIB_NAME = "libgpudash_preload.so"
PRELOAD_LIB_ENV = "GPUDASH_PRELOAD_LIB"
SWITCH_ENV = "GPUDASH_PRELOAD"
NAME_ENV = "GPUDASH_PRELOAD_NAME"
KNOBS_ENV = "GPUDASH_PRELOAD_KNOBS"

SHM_DIR = Path("/dev/shm")  # where glibc's shm_open puts "/name" segments
STATS_PREFIX = "gpudash-preload-stats-"
KNOBS_PREFIX = "gpudash-preload-knobs-"
MAGIC = 0x4C504447  # "GDPL"
VERSION = 2
MAX_PATHS = 64
NAME_LEN = 64
MAX_GPUS = 16
STATES = ("active", "off", "failed", "passthrough")  # GP_STATE_* by value

# The knobs a preloaded engine has: the native struct's, plus the pageable staging thresholds.
# A preloaded engine takes the live knobs of the one knob table (gpudash/engine/config.py).
PRELOAD_KNOBS = tuple(k.name for k in KNOB_TABLE if k.live)


class DirectionStatsC(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "copies_taken", "copies_passed", "bytes_taken", "bytes_passed", "ns_in_calls_taken",
        "ns_to_landed_taken", "staged_copies", "errors")]


class StatsBlockC(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32), ("version", ctypes.c_uint32), ("seq", ctypes.c_uint64),
        ("pid", ctypes.c_int32), ("state", ctypes.c_int32), ("num_paths", ctypes.c_int32),
        ("num_gpus", ctypes.c_int32), ("started_at", ctypes.c_double), ("updated_at", ctypes.c_double),
        ("name", ctypes.c_char * NAME_LEN), ("dir", DirectionStatsC * 2), ("knobs_generation", ctypes.c_uint64),
        ("knobs", N.Knobs), ("h2d_staging_bytes", ctypes.c_uint64), ("d2h_staging_bytes", ctypes.c_uint64),
        ("engine_start_ns", ctypes.c_uint64), ("paths", N.PathStatsC * MAX_PATHS), ("links", N.LinkStatsC * MAX_GPUS),
    ]


class KnobsBlockC(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32), ("version", ctypes.c_uint32), ("seq", ctypes.c_uint64),
        ("generation", ctypes.c_uint64), ("knobs", N.Knobs), ("h2d_staging_bytes", ctypes.c_uint64),
        ("d2h_staging_bytes", ctypes.c_uint64), ("enabled", ctypes.c_int32), ("reserved", ctypes.c_int32),
        ("rejected_generation", ctypes.c_uint64),
    ]


class PreloadLibraryMissing(EngineError):
    """libgpudash_preload.so is not installed or built."""


class BlockUnavailable(EngineError):
    """A process's block is absent, not initialised yet, of another layout, or held mid-write."""


# ---- the library and the environment that starts a process under it ---------------------------------


def preload_library() -> Path:
    """The newest libgpudash_preload.so: $GPUDASH_PRELOAD_LIB, beside the engine library (wheel,
    editable install) or in the repository's build/ tree."""
    env = os.environ.get(PRELOAD_LIB_ENV)
    if env:
        if not Path(env).is_file():
            raise PreloadLibraryMissing(f"{PRELOAD_LIB_ENV}={env} is not a file; unset it or point it at "
                                        f"{PRELOAD_LIB_NAME}", N.ENOTSUP, "GE_ENOTSUP")
        return Path(env).resolve()
    found = [p for p in N._candidates(PRELOAD_LIB_NAME, PRELOAD_LIB_ENV) if p.is_file()]
    if not found:
        raise PreloadLibraryMissing(
            f"the preload library {PRELOAD_LIB_NAME} was not found; build it with `pip install .` or "
            f"`cmake -S . -B build/dev && cmake --build build/dev`, or set {PRELOAD_LIB_ENV}",
            N.ENOTSUP, "GE_ENOTSUP")
    return max(found, key=lambda p: p.stat().st_mtime).resolve()


def preload_knobs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of engine settings a preloaded engine has (e.g. not the registration cache's cap)."""
    return {k: v for k, v in settings.items() if k in PRELOAD_KNOBS}


def encode_knobs(knobs: Mapping[str, Any]) -> str:
    """GPUDASH_PRELOAD_KNOBS's value for `knobs` (validated; booleans as 1/0)."""
    other = sorted(set(knobs) - set(PRELOAD_KNOBS))
    if other:
        raise EngineArgumentError(f"knob {', '.join(other)} does not apply to a preloaded process; its knobs "
                                  f"are: {', '.join(PRELOAD_KNOBS)}")
    checked = validate_knobs(dict(knobs))
    return ",".join(f"{k}={int(v)}" for k, v in checked.items())


def preload_env(base: Mapping[str, str], name: str, knobs: Mapping[str, Any],
                library: Path | None = None) -> dict[str, str]:
    """`base` with the preload library first in LD_PRELOAD (once), the server's name and the start-up
    knobs; raises PreloadLibraryMissing or EngineArgumentError before anything is started."""
    lib = library or preload_library()
    env = dict(base)
    kept = [p for p in re.split(r"[: ]+", env.get("LD_PRELOAD", "")) if p and Path(p).name != PRELOAD_LIB_NAME]
    env["LD_PRELOAD"] = ":".join([str(lib), *kept])
    env[NAME_ENV] = name
    value = encode_knobs(knobs)
    if value:
        env[KNOBS_ENV] = value
    else:
        env.pop(KNOBS_ENV, None)
    return env


# ---- named views of the blocks -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DirectionStats:
    """One direction's copy counters (see gp_direction_stats); times in nanoseconds."""

    copies_taken: int
    copies_passed: int
    bytes_taken: int
    bytes_passed: int
    ns_in_calls_taken: int
    ns_to_landed_taken: int
    staged_copies: int
    errors: int


@dataclass(frozen=True, slots=True)
class PreloadStats:
    """One consistent read of a preloaded process's stats block."""

    pid: int
    name: str
    state: str
    started_at: float
    updated_at: float
    h2d: DirectionStats
    d2h: DirectionStats
    knobs_generation: int
    knobs: dict[str, Any]
    paths: tuple[PathStats, ...]
    links: tuple[LinkStats, ...]
    engine_start_s: float | None  # how long the engine took to start (None: not started yet)

    def summary_lines(self) -> list[str]:
        """Copies taken vs passed through, bytes, time and GB/s per direction, as an aligned table."""
        head = f"{'dir':<4}{'taken':>9}{'passed':>9}{'GB taken':>10}{'GB passed':>10}{'s in calls':>11}" \
               f"{'s landed':>10}{'GB/s':>8}{'staged':>8}{'errors':>7}"
        rows = [head]
        for label, d in (("h2d", self.h2d), ("d2h", self.d2h)):
            rate = f"{d.bytes_taken / d.ns_to_landed_taken:.2f}" if d.ns_to_landed_taken else "—"
            rows.append(f"{label:<4}{d.copies_taken:>9}{d.copies_passed:>9}{d.bytes_taken / 1e9:>10.3f}"
                        f"{d.bytes_passed / 1e9:>10.3f}{d.ns_in_calls_taken / 1e9:>11.3f}"
                        f"{d.ns_to_landed_taken / 1e9:>10.3f}{rate:>8}{d.staged_copies:>8}{d.errors:>7}")
        if self.engine_start_s is not None:
            rows.append(f"the engine started in {self.engine_start_s * 1e3:.1f} ms, beside the first copy")
        return rows


def _knobs_dict(k: N.Knobs, h2d_staging: int, d2h_staging: int) -> dict[str, Any]:
    out: dict[str, Any] = {f: getattr(k, f) for f, _ in N.Knobs._fields_ if not f.startswith("reserved")}
    for b in (k.name for k in KNOB_TABLE if k.is_bool):
        out[b] = bool(out[b])
    return {**out, "h2d_staging_bytes": h2d_staging, "d2h_staging_bytes": d2h_staging}


def _direction(c: DirectionStatsC) -> DirectionStats:
    return DirectionStats(*(getattr(c, f.name) for f in fields(DirectionStats)))


def stats_from_c(b: StatsBlockC) -> PreloadStats:
    """The named view of a raw stats block (a consistent copy)."""
    paths = tuple(PathStats(path_name(p.gpu, p.via, p.direction), p.gpu, None if p.via == p.gpu else p.via,
                            "h2d" if p.direction == N.H2D else "d2h", p.bytes, p.chunks, p.queue_depth, p.gbps,
                            p.cpu_s, bool(p.failed)) for p in b.paths[: max(0, min(b.num_paths, MAX_PATHS))])
    links = tuple(LinkStats(l.gpu, l.h2d_bytes, l.d2h_bytes) for l in b.links[: max(0, min(b.num_gpus, MAX_GPUS))])
    state = STATES[b.state] if 0 <= b.state < len(STATES) else f"unknown({b.state})"
    return PreloadStats(b.pid, b.name.decode("utf-8", "replace"), state, b.started_at, b.updated_at,
                        _direction(b.dir[N.H2D]), _direction(b.dir[N.D2H]), b.knobs_generation,
                        _knobs_dict(b.knobs, b.h2d_staging_bytes, b.d2h_staging_bytes), paths, links,
                        b.engine_start_ns / 1e9 if b.engine_start_ns else None)


# ---- the sequence lock ---------------------------------------------------------------------------------


def read_consistent(buf: Any, cls: type[ctypes.Structure], what: str, tries: int = 400) -> Any:
    """A copy of `cls` from `buf` taken while its writer was not writing: copy, and retry while `seq`
    was odd or changed meanwhile. A writer that stays mid-write (it died there) ends in BlockUnavailable
    after about 0.2 s rather than a hang."""
    off = cls.seq.offset  # type: ignore[attr-defined]
    for attempt in range(tries):
        before = struct.unpack_from("=Q", buf, off)[0]
        if not before & 1:
            copy = cls.from_buffer_copy(buf)
            if copy.seq == before == struct.unpack_from("=Q", buf, off)[0]:
                return copy
        if attempt >= 8:
            time.sleep(0.0005)
    raise BlockUnavailable(f"{what} stayed mid-write (seq odd or changing) for {tries} reads; its writer "
                           "may have died while writing", N.EBUSY, "GE_EBUSY")


def _map(path: Path, cls: type[ctypes.Structure], writable: bool) -> tuple[int, mmap.mmap]:
    """An fd and a mapping of the block at `path`, checked for size, magic and version."""
    try:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    except OSError as err:
        raise BlockUnavailable(f"cannot open {path}: {err.strerror}", N.ENOTSUP, "GE_ENOTSUP") from None
    try:
        size = os.fstat(fd).st_size
        if size < ctypes.sizeof(cls):
            raise BlockUnavailable(f"{path} holds {size} bytes, not the {ctypes.sizeof(cls)} of its layout (not "
                                   "initialised yet, or another version)", N.ENOTSUP, "GE_ENOTSUP")
        mm = mmap.mmap(fd, ctypes.sizeof(cls), prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        magic, version = struct.unpack_from("=II", mm, 0)
        if magic != MAGIC or version != VERSION:
            mm.close()
            raise BlockUnavailable(f"{path} has magic {magic:#x} version {version}, expected {MAGIC:#x} version "
                                   f"{VERSION} (not initialised yet, or another gpudash version)", N.ENOTSUP,
                                   "GE_ENOTSUP")
    except BaseException:
        os.close(fd)
        raise
    return fd, mm


class StatsView:
    """A read-only mapping of one process's stats block. The mapping outlives the segment's unlink, so
    the last values stay readable after the process exits."""

    def __init__(self, pid: int, shm_dir: Path = SHM_DIR):
        self.pid = pid
        self.path = Path(shm_dir) / f"{STATS_PREFIX}{pid}"
        self._fd, self._mm = _map(self.path, StatsBlockC, writable=False)

    def read_raw(self) -> StatsBlockC:
        return read_consistent(self._mm, StatsBlockC, str(self.path))

    def read(self) -> PreloadStats:
        return stats_from_c(self.read_raw())

    def read_after(self, t: float, timeout_s: float = 5.0) -> PreloadStats:
        """The first publish made after `t` (time.time()): a process publishes every ~100 ms, so a plain
        read just after some copies may predate them. The latest one if none came within `timeout_s`."""
        s = self.read()
        while s.updated_at <= t and time.time() < t + timeout_s:
            time.sleep(0.01)
            s = self.read()
        return s

    def close(self) -> None:
        if self._fd >= 0:
            self._mm.close()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> StatsView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class KnobsState:
    generation: int
    knobs: dict[str, Any]
    enabled: bool
    rejected_generation: int


class KnobBlock:
    """A read-write mapping of one process's knob block."""

    def __init__(self, pid: int, shm_dir: Path = SHM_DIR):
        self.pid = pid
        self.path = Path(shm_dir) / f"{KNOBS_PREFIX}{pid}"
        self._fd, self._mm = _map(self.path, KnobsBlockC, writable=True)
        self._view: KnobsBlockC | None = KnobsBlockC.from_buffer(self._mm)

    def read(self) -> KnobsState:
        b = read_consistent(self._mm, KnobsBlockC, str(self.path))
        return KnobsState(b.generation, _knobs_dict(b.knobs, b.h2d_staging_bytes, b.d2h_staging_bytes),
                          bool(b.enabled), self.rejected_generation())

    def rejected_generation(self) -> int:
        """The last generation the process refused (the process's own word, outside the lock)."""
        return struct.unpack_from("=Q", self._mm, KnobsBlockC.rejected_generation.offset)[0]

    def write(self, knobs: Mapping[str, Any], enabled: bool = True) -> int:
        """Publish a complete knob set (every PRELOAD_KNOBS entry, validated first); returns its generation."""
        missing = [k for k in PRELOAD_KNOBS if k not in knobs]
        if missing:
            raise EngineArgumentError(f"a knob block holds every preload knob; missing: {', '.join(missing)}")
        encode_knobs(knobs)  # validates, names the first bad knob
        v = self._view
        assert v is not None, "knob block closed"
        c = N.Knobs.of(knobs)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            odd = v.seq | 1  # a writer that died mid-write left it odd already
            v.seq = odd
            v.knobs = c
            v.h2d_staging_bytes = int(knobs["h2d_staging_bytes"])
            v.d2h_staging_bytes = int(knobs["d2h_staging_bytes"])
            v.enabled = int(enabled)
            v.generation = generation = v.generation + 1
            v.seq = odd + 1
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return generation

    def close(self) -> None:
        if self._view is not None:
            self._view = None  # the ctypes view pins the mapping; drop it first
            self._mm.close()
            os.close(self._fd)

    def __enter__(self) -> KnobBlock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def outcome(pid: int, generation: int, shm_dir: Path = SHM_DIR) -> str:
    """"applied", "rejected" or "pending" for knob generation `generation` of process `pid`."""
    with KnobBlock(pid, shm_dir) as kb:
        if kb.rejected_generation() >= generation:
            return "rejected"
    with StatsView(pid, shm_dir) as sv:
        return "applied" if sv.read_raw().knobs_generation >= generation else "pending"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, though its block is not ours to read
        return True
    return True


def preload_pids(shm_dir: Path = SHM_DIR) -> list[int]:
    """Pids of live processes that published a stats block (a dead process's leftover is skipped)."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    pids = sorted(int(n[len(STATS_PREFIX):]) for n in names
                  if n.startswith(STATS_PREFIX) and n[len(STATS_PREFIX):].isdigit())
    return [p for p in pids if p > 0 and _alive(p)]
