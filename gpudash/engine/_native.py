"""The single ctypes choke point to libgpudash_engine.so (csrc/gpudash_engine.h).

The library is loaded lazily on first use. Every C call goes through `call()`, which turns an error
code into an `EngineError` carrying the symbolic name (CUDA error names for driver failures). The C
layer returns raw structs; the Python modules build the named, frozen results.
"""

from __future__ import annotations

import ctypes
import glob
import os
import site
import sys
import threading
from pathlib import Path

from gpudash.engine.config import c_layout
from gpudash.engine.errors import EngineArgumentError, EngineError

LIB_NAME = "libgpudash_engine.so"
# The C ABI's version: the one place it is kept; csrc/abi_version.h is generated from it (knob_header.py).
ABI_VERSION = 2

OK, EINVAL, ENOMEM, ENODEV, EFREED, ERANGE, EPATH, ETIMEOUT, ENOTSUP, ECLOSED, ENOCUDA, EBUSY = (
    0, -1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11)
CUDA_BASE = 10000
H2D, D2H = 0, 1
MEM_PAGEABLE, MEM_PINNED, MEM_DEVICE = 0, 1, 2
HOST_DIRECT, HOST_STAGED = 0, 1
COPY_DIRECT_ONLY = 0x100


_C = {"uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32}


class Knobs(ctypes.Structure):
    """ge_knobs, laid out from the knob table (engine.config.c_layout); fill it by name with `of()`."""

    _fields_ = [(name, _C[ctype]) for name, ctype, _offset in c_layout()]

    @classmethod
    def of(cls, knobs: dict[str, object]) -> "Knobs":
        """The struct for a knob dict (its native knobs; booleans as 0/1, reserved fields 0)."""
        return cls(**{name: int(knobs[name]) for name, _t, _o in c_layout() if not name.startswith("reserved")})


class PathStatsC(ctypes.Structure):
    _fields_ = [
        ("gpu", ctypes.c_int32), ("via", ctypes.c_int32), ("direction", ctypes.c_int32), ("failed", ctypes.c_int32),
        ("bytes", ctypes.c_uint64), ("chunks", ctypes.c_uint64), ("queue_depth", ctypes.c_int32),
        ("reserved", ctypes.c_int32), ("gbps", ctypes.c_double), ("cpu_s", ctypes.c_double),
    ]


class LinkStatsC(ctypes.Structure):
    _fields_ = [
        ("gpu", ctypes.c_int32), ("reserved", ctypes.c_int32), ("h2d_bytes", ctypes.c_uint64),
        ("d2h_bytes", ctypes.c_uint64), ("h2d_gbps", ctypes.c_double), ("d2h_gbps", ctypes.c_double),
    ]


class PoolShardStatsC(ctypes.Structure):
    _fields_ = [
        ("capacity", ctypes.c_uint64), ("used", ctypes.c_uint64), ("free", ctypes.c_uint64),
        ("largest_free", ctypes.c_uint64), ("free_blocks", ctypes.c_uint64), ("failures", ctypes.c_uint64),
        ("allocations", ctypes.c_uint64), ("extents", ctypes.c_uint64), ("fragmentation", ctypes.c_double),
    ]


class CopyDescC(ctypes.Structure):
    """ge_copy_desc: what a copy moves, built once per copy plan."""

    _fields_ = [("direction", ctypes.c_int32), ("gpu", ctypes.c_int32), ("dst", ctypes.c_uint64),
                ("src", ctypes.c_uint64), ("nbytes", ctypes.c_uint64)]


class PoolReplayC(ctypes.Structure):
    _fields_ = [
        ("allocs", ctypes.c_uint64), ("frees", ctypes.c_uint64), ("failures", ctypes.c_uint64),
        ("checks", ctypes.c_uint64), ("failed_at", ctypes.c_int64), ("seconds", ctypes.c_double),
        ("peak_fragmentation", ctypes.c_double), ("peak_used", ctypes.c_uint64),
        ("mean_fragmentation", ctypes.c_double), ("samples", ctypes.c_uint64),
    ]


_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
_I = ctypes.c_int
_D = ctypes.c_double
_PU64 = ctypes.POINTER(ctypes.c_uint64)
_PI = ctypes.POINTER(ctypes.c_int)
_PD = ctypes.POINTER(ctypes.c_double)

_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "ge_abi_version": (_I, []),
    "ge_strerror": (ctypes.c_char_p, [_I]),
    "ge_create_sim": (_I, [_I, _PD, _PD, _PD, _D, _D, ctypes.POINTER(Knobs), ctypes.POINTER(_P)]),
    "ge_create_cuda": (_I, [ctypes.POINTER(Knobs), ctypes.POINTER(_P)]),
    "ge_destroy": (None, [_P]),
    "ge_num_gpus": (_I, [_P]),
    "ge_device_name": (_I, [_P, _I, ctypes.c_char_p, _I]),
    "ge_peer_gbps": (_I, [_P, _I, _I, _PD]),
    "ge_now": (_D, [_P]),
    "ge_set_knobs": (_I, [_P, ctypes.POINTER(Knobs)]),
    "ge_get_knobs": (_I, [_P, ctypes.POINTER(Knobs)]),
    "ge_engine_pool": (_I, [_P, _I, ctypes.POINTER(_P), _PI, _PU64, _PU64, _PU64, _PU64]),
    "ge_pool_need": (_I, [_P, ctypes.POINTER(Knobs), _I, _PU64]),
    "ge_num_paths": (_I, [_P]),
    "ge_stats": (_I, [_P, ctypes.POINTER(PathStatsC), _I, ctypes.POINTER(LinkStatsC), _I]),
    "ge_sim_set_link": (_I, [_P, _I, _D]),
    "ge_sim_fail_path": (_I, [_P, _I, _I, _I, _I]),
    "ge_sim_track": (_I, [_P, _U64, _U64, _I, _I]),
    "ge_sim_untrack": (_I, [_P, _U64, _I]),
    "ge_alloc_device": (_I, [_P, _I, _U64, _PU64]),
    "ge_free_device": (_I, [_P, _U64]),
    "ge_alloc_host": (_I, [_P, _U64, _PU64]),
    "ge_free_host": (_I, [_P, _U64]),
    "ge_classify": (_I, [_P, _U64, _PI, _PI, _PU64]),
    "ge_kind": (_I, [_P, _U64]),
    "ge_host_register": (_I, [_P, _U64, _U64]),
    "ge_host_unregister": (_I, [_P, _U64]),
    "ge_copy": (_I, [_P, ctypes.POINTER(CopyDescC), _I, _U64, _PU64]),
    "ge_wait": (_I, [_P, _U64, _D]),
    "ge_copy_chunks": (_I, [_P, _U64, _PU64, _PI]),
    "ge_finish": (_I, [_P, _U64, _D, _PU64, _PI]),
    "ge_copy_sync": (_I, [_P, ctypes.POINTER(CopyDescC), _I, _U64, _PU64]),
    "ge_release": (_I, [_P, _U64]),
    "gp_pool_create": (_I, [_U64, _U64, _U64, ctypes.POINTER(_P)]),
    "gp_pool_destroy": (None, [_P]),
    "gp_pool_unassigned": (_U64, [_P]),
    "gp_pool_set_policy": (_I, [_P, _I]),
    "gp_shard_add": (_I, [_P, _U64, _PI, _PU64]),
    "gp_shard_remove": (_I, [_P, _I, _PU64]),
    "gp_shard_resize": (_I, [_P, _I, _U64, _PU64]),
    "gp_stats": (_I, [_P, _I, ctypes.POINTER(PoolShardStatsC)]),
    "gp_alloc": (_I, [_P, _I, _U64, _U64, _PU64, _PU64]),
    "gp_free": (_I, [_P, _U64, _PI]),
    "gp_lookup": (_I, [_P, _U64, _PU64, _PI]),
    "gp_check": (_I, [_P, ctypes.c_char_p, _I]),
    "gp_replay": (_I, [_P, _U64, _P, _P, _P, _P, _P, _U64, _U64, ctypes.POINTER(PoolReplayC), ctypes.c_char_p, _I]),
}

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def _candidates(name: str = LIB_NAME, env_var: str = "GPUDASH_ENGINE_LIB") -> list[Path]:
    """Where library `name` may be: $env_var, beside this file (wheel), the site-packages `gpudash/engine`
    folder (editable installs), then the repository's build/ tree (development)."""
    out: list[Path] = []
    env = os.environ.get(env_var)
    if env:
        out.append(Path(env))
    here = Path(__file__).resolve().parent
    out.append(here / name)
    for sp in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]:
        if sp:
            out.append(Path(sp) / "gpudash" / "engine" / name)
    out += [Path(p) for p in sorted(glob.glob(str(here.parents[1] / "build" / "**" / name), recursive=True))]
    return out


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first call)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            env = os.environ.get("GPUDASH_ENGINE_LIB")
            if env and not Path(env).is_file():
                raise EngineError(f"GPUDASH_ENGINE_LIB={env} is not a file; unset it or point it at "
                                  f"{LIB_NAME}", ENOTSUP, "GE_ENOTSUP")
            found = [p for p in _candidates() if p.is_file()]
            tried = [str(p) for p in _candidates()]
            if env:
                handle = ctypes.CDLL(env)
            elif found:  # the newest build wins (an editable install's copy vs a fresh cmake build)
                handle = ctypes.CDLL(str(max(found, key=lambda p: p.stat().st_mtime)))
            else:
                raise EngineError(
                    f"the engine's native library {LIB_NAME} was not found; build it with `pip install .` "
                    f"or `cmake -S . -B build/dev && cmake --build build/dev`, or set GPUDASH_ENGINE_LIB "
                    f"(looked in {', '.join(tried[:4])}, ...)", ENOTSUP, "GE_ENOTSUP")
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.restype = res
                fn.argtypes = args
            if handle.ge_abi_version() != ABI_VERSION:
                raise EngineError(f"{LIB_NAME} has ABI {handle.ge_abi_version()}, this package needs "
                                  f"{ABI_VERSION}; rebuild it", ENOTSUP, "GE_ENOTSUP")
            _lib = handle
    return _lib


def error_name(code: int) -> str:
    return lib().ge_strerror(code).decode()


_MEANING = {
    EINVAL: "an argument is out of range", ENOMEM: "out of memory", ENODEV: "no such GPU",
    EFREED: "not a live allocation", ERANGE: "buffer smaller than the copy",
    EPATH: "every path that could carry the copy failed", ENOTSUP: "not supported by this backend",
    ECLOSED: "the engine is closed", EBUSY: "in use or overlapping an existing allocation",
    ENOCUDA: "the NVIDIA driver (libcuda.so.1) could not be loaded or initialised; use backend 'sim' "
             "on a machine without a GPU",
}


def check(rc: int, what: str) -> None:
    """Raise the exception matching a non-zero code; `what` says which call and on what."""
    if rc == OK:
        return
    name = error_name(rc)
    cls = EngineArgumentError if rc in (EINVAL, ENODEV, EFREED, ERANGE) else EngineError
    meaning = _MEANING.get(rc, "CUDA driver error" if rc >= CUDA_BASE else "")
    raise cls(f"{what} failed: {name} ({meaning})" if meaning else f"{what} failed: {name}", rc, name)


def call(name: str, *args: object) -> int:
    """Call a C function by name and return its raw result (no error translation)."""
    return getattr(lib(), name)(*args)
