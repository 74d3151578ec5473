"""The one choke point around NVML (nvidia-ml-py's `pynvml`), modelled on nvitop's libnvml: every NVML
call in gpudash goes through `call` or `versioned` here.

NVML is initialised lazily on first use and shut down once at exit, after the calls in flight. A value a
GPU cannot give comes back as the `NA` sentinel instead of an exception (records carry None for it). A
function this driver lacks is NA too, and is logged once (logger "gpudash.gpu.nvml", INFO) and listed by
`missing_functions()`, so "not supported" and "not in this driver" can be told apart. Devices are
gpu/device.py; what is sampled each tick is telemetry/nvml.py.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pynvml

log = logging.getLogger(__name__)



class _NAType:
    """Sentinel for a value NVML cannot give for this GPU (unsupported, no permission, ...)."""

    _instance: _NAType | None = None

    def __new__(cls) -> _NAType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "N/A"

    def __bool__(self) -> bool:
        return False


NA: Any = _NAType()

# NVML's life in this process, as nvitop's libnvml keeps it: initialised on first use, shut down once at
# exit after the calls in flight (the pollers' threads) have returned.
_lock = threading.Lock()
_idle = threading.Condition(_lock)  # notified when the last call in flight returns during shutdown
_init_error: str | None = None
_initialised = False
_closing = False  # set by shutdown(): no NVML call starts after it
_in_flight = 0  # NVML calls running now (through call() / versioned())
SHUTDOWN_WAIT_S = 2.0  # how long shutdown() waits for calls in flight (a driver call can hang)



def init() -> str | None:
    """Initialise NVML once; returns None on success, else why it cannot be used."""
    global _init_error, _initialised
    with _lock:
        if _initialised or _init_error is not None:
            return _init_error
        if _closing:
            return "NVML was shut down (gpudash is exiting)"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            _init_error = "libnvidia-ml.so not found"
        except pynvml.NVMLError_DriverNotLoaded:
            _init_error = "the NVIDIA kernel driver is not loaded"
        except pynvml.NVMLError as err:
            _init_error = f"NVML failed to initialise: {err}"
        else:
            _initialised = True
            atexit.register(shutdown)
        return _init_error


def shutdown(wait_s: float = SHUTDOWN_WAIT_S) -> None:
    """nvmlShutdown once, after the NVML calls in flight have returned; calls after it answer NA.
    Registered at exit by the first successful init. A call still running after `wait_s` (a hung driver)
    is not waited for: NVML is then left to the process's exit, since shutting it down under a running
    call is what must not happen."""
    global _closing, _initialised
    with _idle:
        if _closing:
            return
        _closing = True
        if not _initialised:
            return
        if not _idle.wait_for(lambda: _in_flight == 0, timeout=wait_s):
            return
        _initialised = False
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def driver_available() -> str | None:
    """None when NVML initialises and sees at least one GPU, else the reason in a few words."""
    reason = init()
    if reason is None and device_count() == 0:
        return "NVML reports no GPUs"
    return reason


def driver_version() -> str | None:
    """The NVIDIA driver's version string, or None without NVML."""
    if init() is not None:
        return None
    return text(none(call(pynvml.nvmlSystemGetDriverVersion)) or "") or None


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports ("12.4"), or None without NVML."""
    if init() is not None:
        return None
    v = none(call(pynvml.nvmlSystemGetCudaDriverVersion))
    return f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) and v > 0 else None


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args)`, or NA when NVML says the value is unavailable for this GPU (or NVML was shut down).
    Counted in flight, so that shutdown() waits for it."""
    if not _enter():
        return NA
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError_FunctionNotFound:
        _missing(getattr(fn, "__name__", repr(fn)))
        return NA
    except pynvml.NVMLError:
        return NA
    finally:
        _leave()


@contextmanager
def in_flight() -> Iterator[bool]:
    """The NVML calls made inside the block count in flight, as call()'s do, for code that needs NVML's
    exceptions (xid.py's event set); yields False, and the block should call nothing, once NVML is shut down."""
    if not _enter():
        yield False
        return
    try:
        yield True
    finally:
        _leave()


def _enter() -> bool:
    """Counts one more call in flight; False (nothing counted) once shutdown() has begun."""
    global _in_flight
    with _lock:
        if _closing:
            return False
        _in_flight += 1
        return True


def _leave() -> None:
    global _in_flight
    with _idle:
        _in_flight -= 1
        if _closing and _in_flight == 0:
            _idle.notify_all()


_VERSION_SUFFIXES = ("_v3", "_v2", "_v1")
_chosen: dict[str, Callable[..., Any]] = {}  # per NVML function: the variant this driver answered


def versioned(name: str, *args: Any) -> Any:
    """pynvml's `name(*args)` through the newest variant this driver has, as call() answers it: `name` itself,
    then `name_v3`, `name_v2`, `name_v1` where pynvml has them. nvidia-ml-py binds the unsuffixed name to
    the newest C symbol, which a driver older than it lacks (FunctionNotFound); the next older variant
    answers instead, as in nvitop's libnvml. The variant that answered is kept for the next calls."""
    fn = _chosen.get(name)
    if fn is not None:
        return call(fn, *args)
    variants = [v for v in (getattr(pynvml, name + s, None) for s in ("", *_VERSION_SUFFIXES)) if v is not None]
    for fn in variants:
        value = call(_or_missing, fn, *args)
        if value is not _MISSING:
            _chosen[name] = fn
            return value
    _missing(name)
    return NA


_MISSING = object()


def _or_missing(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or _MISSING when this driver lacks the C function behind the pynvml variant `fn`."""
    try:
        return fn(*args)
    except pynvml.NVMLError_FunctionNotFound:
        return _MISSING


def none(value: Any) -> Any:
    """NA -> None, for records."""
    return None if value is NA else value


def device_count() -> int:
    if init() is not None:
        return 0
    count = call(pynvml.nvmlDeviceGetCount)
    return 0 if count is NA else int(count)


_memory_v2 = True  # until the driver says it lacks nvmlDeviceGetMemoryInfo_v2


def memory_info(handle: Any) -> Any:
    """Memory info, v2 where the driver has it (used excludes driver-reserved memory, as nvidia-smi shows)."""
    global _memory_v2
    if _memory_v2:
        mem = call(pynvml.nvmlDeviceGetMemoryInfo, handle, version=pynvml.nvmlMemory_v2)
        if mem is not NA:
            return mem
        _memory_v2 = False
    return call(pynvml.nvmlDeviceGetMemoryInfo, handle)


def field_int(fv: Any) -> int | None:
    """An integer field value (nvmlDeviceGetFieldValues), or None where NVML could not read it."""
    if fv.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    vt = fv.valueType
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(fv.value.uiVal)
    if vt == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return int(fv.value.dVal)
    return int(fv.value.ullVal)


_missing_names: set[str] = set()


def _missing(name: str) -> None:
    """Say once that this driver lacks the NVML function `name` (its values then show as N/A)."""
    if name not in _missing_names:
        _missing_names.add(name)
        log.info("NVML function %s is not in this driver; what it reads shows as N/A", name)


def missing_functions() -> list[str]:
    """The NVML functions this driver lacked so far, each logged once when first missed."""
    return sorted(_missing_names)


def text(value: Any) -> str:
    """An NVML string (bytes in older pynvml) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)
