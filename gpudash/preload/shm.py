"""The contract with a process running under libgpudash_preload.so: where the library is, the
environment that starts it (both in env.py), and the two shared-memory blocks it creates (ctypes mirror of
csrc/preload/gpudash_preload_shm.h; tests/preload_app keeps the two layouts equal).

Environment the preloaded process reads:
  GPUDASH_PRELOAD=off          pass every copy through (the kill switch)
  GPUDASH_PRELOAD_NAME         the server's name, copied into the stats block
  GPUDASH_PRELOAD_KNOBS        start-up knobs, ``name=integer`` pairs joined by commas, e.g.
                               ``h2d_chunk_bytes=2810000,direct_first=1,staging_threads=8``; knobs left
                               out keep the library's own defaults; a value outside the knob table's
                               range, or not plain digits, makes the library pass every copy through
                               with one line on stderr
  GPUDASH_PRELOAD_KEEP_FOR     a pid (`gpudash run --stats`'s own): when that is the process's parent, its
                               blocks stay at exit for the parent to read and remove

Both blocks use a sequence lock (`seq` odd while its writer writes). The stats block is written by the
process and only read here; the knob block is written here (under an flock, so two gpudash processes
never interleave) and read by the process, which writes only its `rejected_generation` word.
/dev/shm is open to every local user, so neither side maps a block (a block truncated under a mapping
gives SIGBUS): they read and write with pread/pwrite, and open a name only without following a symlink
or waiting on a FIFO, and only when it is a regular file of this user.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import re
import struct
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from gpudash.engine import _native as N
from gpudash.engine.config import KNOB_TABLE
from gpudash.engine.errors import EngineArgumentError, EngineError
from gpudash.engine.results import LinkStats, PathStats
from gpudash.engine.transfer import path_name
# The environment and the blocks' names live in env.py (what starting a program needs); they are named here
# too, so this module stays the contract's one namespace for its readers.
from gpudash.preload.env import (KEEP_FOR_ENV, KNOBS_ENV, KNOBS_PREFIX, NAME_ENV, PRELOAD_KNOBS, PRELOAD_LIB_ENV,
                                 PRELOAD_LIB_NAME, SHM_DIR, STATS_PREFIX, SWITCH_ENV, PreloadLibraryMissing,
                                 encode_knobs, odd_entry, preload_env, preload_knobs, preload_library)

log = logging.getLogger(__name__)

MAGIC = 0x4C504447  # "GDPL"
VERSION = 3
MAX_PATHS = 64
NAME_LEN = 64
MAX_GPUS = 16
STATES = ("active", "off", "failed", "passthrough")  # GP_STATE_* by value
# Why a copy worth a decision was passed through (GP_WHY_* by value; 0 is a taken copy's).
PASS_REASONS = ("taken", "engine not running", "pinned, direct path only", "below threshold",
                "not host<->device", "stream capture", "past the allocation", "a call failed")

class DirectionStatsC(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "copies_taken", "copies_passed", "bytes_taken", "bytes_passed", "ns_in_calls_taken",
        "ns_to_landed_taken", "staged_copies", "errors")] + [
        ("passed_why", ctypes.c_uint64 * len(PASS_REASONS)), ("cpu_ns_calls_taken", ctypes.c_uint64)]


class StatsBlockC(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32), ("version", ctypes.c_uint32), ("seq", ctypes.c_uint64),
        ("pid", ctypes.c_int32), ("state", ctypes.c_int32), ("num_paths", ctypes.c_int32),
        ("num_gpus", ctypes.c_int32), ("started_at", ctypes.c_double), ("updated_at", ctypes.c_double),
        ("name", ctypes.c_char * NAME_LEN), ("dir", DirectionStatsC * 2), ("knobs_generation", ctypes.c_uint64),
        ("knobs", N.Knobs), ("h2d_staging_bytes", ctypes.c_uint64), ("d2h_staging_bytes", ctypes.c_uint64),
        ("engine_start_ns", ctypes.c_uint64), ("threads_cpu_ns", ctypes.c_uint64),
        ("paths", N.PathStatsC * MAX_PATHS), ("links", N.LinkStatsC * MAX_GPUS),
    ]


class KnobsBlockC(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32), ("version", ctypes.c_uint32), ("seq", ctypes.c_uint64),
        ("generation", ctypes.c_uint64), ("knobs", N.Knobs), ("h2d_staging_bytes", ctypes.c_uint64),
        ("d2h_staging_bytes", ctypes.c_uint64), ("enabled", ctypes.c_int32), ("reserved", ctypes.c_int32),
        ("rejected_generation", ctypes.c_uint64),
    ]


class BlockUnavailable(EngineError):
    """A process's block is absent, not initialised yet, of another layout, or held mid-write."""


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
    passed_why: tuple[int, ...]  # by PASS_REASONS; copies below every threshold are in copies_passed only
    cpu_ns_calls_taken: int  # CPU of the calling threads inside the taken calls


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
    threads_cpu_s: float  # CPU of the engine's and the interposer's own threads, idle spinning included

    def cpu_s(self, direction: str) -> float:
        """Core-seconds the taken copies of one direction cost: the calling threads' CPU inside the taken
        calls, plus gpudash's own threads' CPU (idle spinning included) shared out between the directions
        by the CPU the engine's paths account to each (by bytes where they account none)."""
        d = self.h2d if direction == "h2d" else self.d2h
        mine = sum(p.cpu_s for p in self.paths if p.direction == direction)
        every = sum(p.cpu_s for p in self.paths)
        if every <= 0:
            mine, every = d.bytes_taken, self.h2d.bytes_taken + self.d2h.bytes_taken
        return d.cpu_ns_calls_taken / 1e9 + (self.threads_cpu_s * mine / every if every else 0.0)

    def paths_cpu_s(self) -> tuple[float, ...]:
        """Each path's part of its direction's cost (cpu_s), by the bytes it carried; in `paths` order. All
        at once: a path at a time summed every path for each (128 paths on 8 GPUs)."""
        per_byte = {}
        for direction in ("h2d", "d2h"):
            moved = sum(p.bytes for p in self.paths if p.direction == direction)
            per_byte[direction] = self.cpu_s(direction) / moved if moved else 0.0
        return tuple(per_byte[p.direction] * p.bytes for p in self.paths)

    def summary_lines(self) -> list[str]:
        """Copies taken vs passed through, bytes, time, GB/s and core-seconds per GB per direction, then
        why copies worth a decision were passed, as an aligned table."""
        head = f"{'dir':<4}{'taken':>9}{'passed':>9}{'GB taken':>10}{'GB passed':>10}{'s in calls':>11}" \
               f"{'s landed':>10}{'GB/s':>8}{'staged':>8}{'errors':>7}{'CPU s/GB':>9}"
        rows = [head]
        for label, d in (("h2d", self.h2d), ("d2h", self.d2h)):
            rate = f"{d.bytes_taken / d.ns_to_landed_taken:.2f}" if d.ns_to_landed_taken else "—"
            cpu = f"{self.cpu_s(label) / (d.bytes_taken / 1e9):.3f}" if d.bytes_taken else "—"
            rows.append(f"{label:<4}{d.copies_taken:>9}{d.copies_passed:>9}{d.bytes_taken / 1e9:>10.3f}"
                        f"{d.bytes_passed / 1e9:>10.3f}{d.ns_in_calls_taken / 1e9:>11.3f}"
                        f"{d.ns_to_landed_taken / 1e9:>10.3f}{rate:>8}{d.staged_copies:>8}{d.errors:>7}{cpu:>9}")
        for label, d in (("h2d", self.h2d), ("d2h", self.d2h)):
            why = [f"{n} {PASS_REASONS[i]}" for i, n in enumerate(d.passed_why) if i and n]
            if why:
                rows.append(f"{label} passed: " + ", ".join(why))
        rows.append(f"gpudash's own threads used {self.threads_cpu_s:.3f} core-s (idle spinning included)")
        if self.engine_start_s is not None:
            rows.append(f"the engine started in {self.engine_start_s * 1e3:.1f} ms, beside the first copy")
        return rows


def _knobs_dict(k: N.Knobs, h2d_staging: int, d2h_staging: int) -> dict[str, Any]:
    out: dict[str, Any] = {f: getattr(k, f) for f, _ in N.Knobs._fields_ if not f.startswith("reserved")}
    for b in (k.name for k in KNOB_TABLE if k.is_bool):
        out[b] = bool(out[b])
    return {**out, "h2d_staging_bytes": h2d_staging, "d2h_staging_bytes": d2h_staging}


def _direction(c: DirectionStatsC) -> DirectionStats:
    values = (getattr(c, f.name) for f in fields(DirectionStats))
    return DirectionStats(*(tuple(v) if isinstance(v, ctypes.Array) else v for v in values))


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
                        b.engine_start_ns / 1e9 if b.engine_start_ns else None, b.threads_cpu_ns / 1e9)


# ---- the sequence lock ---------------------------------------------------------------------------------


def read_consistent(fd: int, cls: type[ctypes.Structure], what: str, tries: int = 400) -> Any:
    """A copy of `cls` read from `fd` while its writer was not writing: read, and retry while `seq` was
    odd or changed meanwhile. A writer that stays mid-write (it died there) ends in BlockUnavailable
    after about 0.2 s rather than a hang. Reads go through pread, never a mapping: a block that someone
    truncates meanwhile gives a short read (BlockUnavailable), where a mapping would give SIGBUS."""
    off, size = cls.seq.offset, ctypes.sizeof(cls)  # type: ignore[attr-defined]
    for attempt in range(tries):
        data = os.pread(fd, size, 0)
        if len(data) < size:
            raise BlockUnavailable(f"{what} holds {len(data)} bytes, not the {size} of its layout (truncated)",
                                   N.ENOTSUP, "GE_ENOTSUP")
        before = struct.unpack_from("=Q", data, off)[0]
        if not before & 1 and os.pread(fd, 8, off) == data[off:off + 8]:
            return cls.from_buffer_copy(data)
        if attempt >= 8:
            time.sleep(0.0005)
    raise BlockUnavailable(f"{what} stayed mid-write (seq odd or changing) for {tries} reads; its writer "
                           "may have died while writing", N.EBUSY, "GE_EBUSY")


class OddEntry(BlockUnavailable):
    """A name in /dev/shm that looks like a block but is not one gpudash may read: not a regular file (a
    FIFO, a symlink, a directory) or another user's. Any local user can make such names: they are skipped."""


def _open(path: Path, cls: type[ctypes.Structure], writable: bool) -> int:
    """An fd of the block at `path`, checked for kind, owner, size, magic and version. The open never
    follows a symlink and never waits (O_NONBLOCK: a FIFO would block an open for reading forever)."""
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise BlockUnavailable(f"cannot open {path}: {err.strerror}", N.ENOTSUP, "GE_ENOTSUP") from None
    try:
        st = os.fstat(fd)
        odd = odd_entry(st)
        if odd is not None:
            raise OddEntry(f"{path} {odd}; skipped", N.ENOTSUP, "GE_ENOTSUP")
        if st.st_size < ctypes.sizeof(cls):
            raise BlockUnavailable(f"{path} holds {st.st_size} bytes, not the {ctypes.sizeof(cls)} of its layout "
                                   "(not initialised yet, truncated, or another version)", N.ENOTSUP, "GE_ENOTSUP")
        magic, version = struct.unpack("=II", os.pread(fd, 8, 0).ljust(8, b"\0"))
        if magic != MAGIC or version != VERSION:
            raise BlockUnavailable(f"{path} has magic {magic:#x} version {version}, expected {MAGIC:#x} version "
                                   f"{VERSION} (not initialised yet, or another gpudash version)", N.ENOTSUP,
                                   "GE_ENOTSUP")
    except BaseException:
        os.close(fd)
        raise
    return fd


class StatsView:
    """One process's stats block, held open and read on demand. The open file outlives the segment's
    unlink, so the last values stay readable after the process exits."""

    def __init__(self, pid: int, shm_dir: Path = SHM_DIR):
        self.pid = pid
        self.path = Path(shm_dir) / f"{STATS_PREFIX}{pid}"
        self._fd = _open(self.path, StatsBlockC, writable=False)

    def read_raw(self) -> StatsBlockC:
        return read_consistent(self._fd, StatsBlockC, str(self.path))

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
    """One process's knob block, held open: read, and written under an flock with the sequence lock.
    Writes go through pwrite (a truncated block is extended again, never a SIGBUS) and stop before the
    process's own `rejected_generation` word."""

    def __init__(self, pid: int, shm_dir: Path = SHM_DIR):
        self.pid = pid
        self.path = Path(shm_dir) / f"{KNOBS_PREFIX}{pid}"
        self._fd = _open(self.path, KnobsBlockC, writable=True)

    def read(self) -> KnobsState:
        b = read_consistent(self._fd, KnobsBlockC, str(self.path))
        return KnobsState(b.generation, _knobs_dict(b.knobs, b.h2d_staging_bytes, b.d2h_staging_bytes),
                          bool(b.enabled), self.rejected_generation())

    def rejected_generation(self) -> int:
        """The last generation the process refused (the process's own word, outside the lock)."""
        word = os.pread(self._fd, 8, KnobsBlockC.rejected_generation.offset)
        return struct.unpack("=Q", word)[0] if len(word) == 8 else 0

    def write(self, knobs: Mapping[str, Any], enabled: bool = True) -> int:
        """Publish a complete knob set (every PRELOAD_KNOBS entry, validated first); returns its generation."""
        missing = [k for k in PRELOAD_KNOBS if k not in knobs]
        if missing:
            raise EngineArgumentError(f"a knob block holds every preload knob; missing: {', '.join(missing)}")
        encode_knobs(knobs)  # validates, names the first bad knob
        assert self._fd >= 0, "knob block closed"
        c = N.Knobs.of(knobs)
        seq_at, ours = KnobsBlockC.seq.offset, KnobsBlockC.rejected_generation.offset
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            data = os.pread(self._fd, ctypes.sizeof(KnobsBlockC), 0)
            if len(data) < ctypes.sizeof(KnobsBlockC):
                raise BlockUnavailable(f"{self.path} holds {len(data)} bytes, not the {ctypes.sizeof(KnobsBlockC)} "
                                       "of its layout (truncated)", N.ENOTSUP, "GE_ENOTSUP")
            v = KnobsBlockC.from_buffer_copy(data)
            odd = v.seq | 1  # a writer that died mid-write left it odd already
            os.pwrite(self._fd, struct.pack("=Q", odd), seq_at)
            v.seq = odd
            v.knobs = c
            v.h2d_staging_bytes = int(knobs["h2d_staging_bytes"])
            v.d2h_staging_bytes = int(knobs["d2h_staging_bytes"])
            v.enabled = int(enabled)
            v.generation = generation = v.generation + 1
            os.pwrite(self._fd, bytes(v)[:ours], 0)
            os.pwrite(self._fd, struct.pack("=Q", odd + 1), seq_at)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return generation

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

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


_PID_NAME = re.compile(r"[1-9][0-9]{0,9}")  # as the library writes a pid (%d): ASCII digits, no sign
_told: set[tuple[str, int]] = set()  # odd entries already noted (name, inode): one debug line each
_TOLD_MAX = 4096  # forgotten past this (names made and removed in a loop must not grow it forever)


def preload_pids(shm_dir: Path = SHM_DIR) -> list[int]:
    """Pids of live processes of this user that published a stats block. A dead process's leftover is
    skipped, and so is every odd entry (a name that is no pid, a FIFO, a symlink, another user's file),
    with one debug line; nothing here opens a file, so nothing can block."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    pids = []
    for name in names:
        if not name.startswith(STATS_PREFIX):
            continue
        tail = name[len(STATS_PREFIX):]
        try:
            st = os.lstat(Path(shm_dir) / name)
        except OSError:
            continue  # removed meanwhile
        odd = None if _PID_NAME.fullmatch(tail) and int(tail) < 2**31 else "does not end in a pid"
        odd = odd or odd_entry(st)
        if odd is not None:
            if (name, st.st_ino) not in _told:
                if len(_told) >= _TOLD_MAX:
                    _told.clear()
                _told.add((name, st.st_ino))
                log.debug("skipping %s in %s: it %s", ascii(name), shm_dir, odd)
            continue
        pids.append(int(tail))
    return [p for p in sorted(pids) if _alive(p)]
