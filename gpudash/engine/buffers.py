"""Turning what a caller passes to copy() into (pointer, size, memory kind): numpy and other
buffer-protocol objects, CuPy arrays and torch tensors (__cuda_array_interface__ / DLPack), the
engine's own DeviceBuffer / HostBuffer, and raw integer pointers with an explicit size."""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, NamedTuple

import numpy as np

from gpudash.engine import _native as N
from gpudash.engine.errors import EngineArgumentError

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3


class Span(NamedTuple):
    """A contiguous byte range and what kind of memory it is (a NamedTuple: built on every copy)."""

    ptr: int
    nbytes: int  # bytes available from ptr (None-like 0 for raw pointers of unknown extent)
    kind: int  # N.MEM_*
    gpu: int | None
    readonly: bool
    owner: Any = None  # weakref-able object owning the whole allocation (registration cache key)
    owner_ptr: int = 0
    owner_nbytes: int = 0


class DeviceBuffer:
    """Device memory the engine allocated. On the sim backend it is a numpy array standing in for the
    GPU's memory (`storage`), so views of it stay valid after free() or close()."""

    def __init__(self, free_fn: Callable[[int], None], ptr: int, nbytes: int, gpu: int,
                 storage: np.ndarray | None = None):
        self._free_fn = free_fn
        self.ptr = ptr
        self.nbytes = nbytes
        self.gpu = gpu
        self._storage = storage
        self.freed = False
        self.in_flight = 0

    def host_view(self) -> np.ndarray:
        """sim backend only: the bytes as a uint8 numpy array (it keeps the memory alive)."""
        if self._storage is None and not self.freed:
            raise EngineArgumentError("host_view() exists only on the sim backend; copy to host with d2h()")
        if self.freed:
            raise EngineArgumentError("this DeviceBuffer was freed; allocate a new one with alloc_device()")
        return self._storage[:]

    def free(self) -> None:
        if self.freed:
            return
        if self.in_flight:
            raise EngineArgumentError("this DeviceBuffer is used by a copy in flight; wait() for it before free()")
        self.freed = True
        self._free_fn(self.ptr)
        self._storage = None

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"{self.nbytes} bytes"
        return f"{type(self).__name__}(gpu={self.gpu}, {state})"


class HostBuffer(DeviceBuffer):
    """Pinned host memory the engine allocated; `array()` views it as numpy uint8."""

    def array(self) -> np.ndarray:
        if self.freed:
            raise EngineArgumentError("this HostBuffer was freed; allocate a new one with alloc_host()")
        if self._storage is None:
            import ctypes

            arr = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.ptr))
            return arr
        return self._storage[:]


def page_aligned(nbytes: int) -> np.ndarray:
    """A page-aligned uint8 numpy array of `nbytes` (sim stand-in for device or pinned memory)."""
    raw = np.empty(nbytes + 4096, dtype=np.uint8)
    off = (-raw.__array_interface__["data"][0]) % 4096
    return raw[off:off + nbytes]


def _owner_of(arr: np.ndarray, ptr: int) -> tuple[Any, int, int]:
    """The weakref-able object owning `arr`'s memory (`arr` starts at `ptr`) and that memory's range,
    or (None, 0, 0)."""
    base: Any = arr
    while isinstance(base, np.ndarray) and not base.flags.owndata and base.base is not None:
        base = base.base
    if base is arr and arr.flags.owndata:
        return arr, ptr, arr.nbytes
    if isinstance(base, np.ndarray) and base.flags.owndata:
        return base, base.__array_interface__["data"][0], base.nbytes
    return None, 0, 0  # foreign owners (mmap, bytes...): lifetime unknown to us, never cached


def _contig_error(arg: str) -> EngineArgumentError:
    return EngineArgumentError(f"{arg} is not contiguous; pass a C-contiguous array "
                               f"(numpy.ascontiguousarray / cupy.ascontiguousarray / tensor.contiguous())")


def _device_index(obj: Any) -> int | None:
    """The GPU of a CuPy array (.device.id) or torch tensor (.device.index), without asking the driver."""
    dev = getattr(obj, "device", None)
    for attr in ("id", "index"):
        v = getattr(dev, attr, None)
        if isinstance(v, int):
            return v
    return None


def _from_cai(obj: Any, arg: str, classify: Callable[[int], tuple[int, int | None, int]]) -> Span:
    cai = obj.__cuda_array_interface__
    ptr, readonly = cai["data"]
    shape = tuple(cai["shape"])
    itemsize = np.dtype(cai["typestr"]).itemsize
    strides = cai.get("strides")
    if strides is not None:
        expect, acc = [], itemsize
        for dim in reversed(shape):
            expect.append(acc)
            acc *= dim
        if any(d > 1 and s != e for d, s, e in zip(shape, strides, reversed(expect))):
            raise _contig_error(arg)
    nbytes = math.prod(shape) * itemsize
    gpu = _device_index(obj)
    if gpu is not None:
        return Span(ptr, nbytes, N.MEM_DEVICE, gpu, bool(readonly))
    kind, gpu, _avail = classify(ptr) if ptr else (N.MEM_DEVICE, None, 0)
    if kind != N.MEM_DEVICE and nbytes:
        raise EngineArgumentError(f"{arg} exposes __cuda_array_interface__ but its pointer is not device memory "
                                  f"this engine's backend knows (CuPy/torch GPU arrays need backend='cuda')")
    return Span(ptr, nbytes, N.MEM_DEVICE, gpu, bool(readonly))


def _from_numpy(arr: np.ndarray, arg: str,
                classify: Callable[[int], tuple[int, int | None, int]]) -> Span:
    if arr.dtype.hasobject:  # its bytes are Python object pointers: bytes copied over them crash the interpreter
        raise EngineArgumentError(f"{arg} is a numpy array of dtype {arr.dtype}, which holds references to Python "
                                  "objects, not plain data; pass an array of a numeric dtype (e.g. uint8)")
    if not arr.flags.c_contiguous:
        raise _contig_error(arg)
    ptr = arr.__array_interface__["data"][0]
    kind = classify(ptr)[0] if ptr else N.MEM_PAGEABLE
    if kind == N.MEM_DEVICE:
        raise EngineArgumentError(f"{arg} is a host array whose memory belongs to a device allocation; "
                                  f"pass the DeviceBuffer itself")
    owner, optr, onb = _owner_of(arr, ptr)
    return Span(ptr, arr.nbytes, kind, None, not arr.flags.writeable, owner, optr, onb)


def resolve(obj: Any, arg: str, nbytes: int | None, classify: Callable[[int], tuple[int, int | None, int]],
            kind_of: Callable[[int], tuple[int, int | None, int]] | None = None) -> Span:
    """Span for `obj` (argument name `arg` in messages); `classify(ptr)` asks the backend what a
    pointer is: (N.MEM_* kind, gpu or None, bytes available from ptr or 0 when unknown); `kind_of` is a
    cheaper variant without the extent, used where the size is known."""
    kind_of = kind_of or classify
    if isinstance(obj, DeviceBuffer):
        if obj.freed:
            raise EngineArgumentError(f"{arg} is a freed {type(obj).__name__}; allocate a new one")
        kind = N.MEM_PINNED if isinstance(obj, HostBuffer) else N.MEM_DEVICE
        return Span(obj.ptr, obj.nbytes, kind, None if kind == N.MEM_PINNED else obj.gpu, False)
    if isinstance(obj, bool):
        raise EngineArgumentError(f"{arg} must be an array, a buffer or an integer pointer, got a boolean")
    if isinstance(obj, (int, np.integer)):
        obj = int(obj)
        if obj <= 0:
            raise EngineArgumentError(f"{arg} is a raw pointer but {obj} is not a valid address")
        if nbytes is None:
            raise EngineArgumentError(f"{arg} is a raw pointer; pass nbytes= to say how many bytes to copy")
        kind, gpu, avail = classify(obj)
        return Span(obj, avail if avail else nbytes, kind, gpu, False)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, arg, kind_of)
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj, arg, kind_of)
    if hasattr(obj, "__dlpack_device__"):
        dev_type, _dev_id = obj.__dlpack_device__()
        if dev_type in (_DL_CPU, _DL_CUDA_HOST):
            if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
                raise _contig_error(arg)
            return _from_numpy(np.from_dlpack(obj), arg, kind_of)
        raise EngineArgumentError(f"{arg} is a DLPack tensor on device type {dev_type} without "
                                  f"__cuda_array_interface__; pass a CuPy array or a torch CUDA tensor")
    try:
        mv = memoryview(obj)
    except TypeError:
        raise EngineArgumentError(f"{arg} must be a numpy/CuPy array, torch tensor, buffer-protocol object, "
                                  f"DeviceBuffer or integer pointer, got {type(obj).__name__}") from None
    if not mv.c_contiguous:
        raise _contig_error(arg)
    arr = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)
    if mv.readonly:
        arr.flags.writeable = False
    return _from_numpy(arr, arg, kind_of)


class SpanCache:
    """resolve() with a per-object memo: a numpy or CuPy/torch array keeps its pointer, size and memory
    kind while it lives, so copying the same array again skips the pointer look-up (a C call) and the
    interface parsing. Entries hold weak references only and go when their array does. Not memoized:
    raw pointers and engine buffers (already cheap), other buffer objects (new views each time), and
    numpy-owned memory that is pinned (it may be a registration that the cache later drops)."""

    MAX = 4096

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Any, ...]] = {}

    def resolve(self, obj: Any, arg: str, nbytes: int | None, classify: Callable[[int], tuple[int, int | None, int]],
                kind_of: Callable[[int], tuple[int, int | None, int]]) -> Span:
        if isinstance(obj, DeviceBuffer):
            return resolve(obj, arg, nbytes, classify, kind_of)
        hit = self._memo.get(id(obj))
        if hit is not None and hit[0]() is obj:
            _ref, ptr, n, kind, gpu, readonly, owner_ref, optr, onb = hit
            if readonly is None:  # numpy: the writeable flag can change
                readonly = not obj.flags.writeable
            return Span(ptr, n, kind, gpu, readonly, owner_ref() if owner_ref else None, optr, onb)
        span = resolve(obj, arg, nbytes, classify, kind_of)
        is_np = isinstance(obj, np.ndarray)
        if not (is_np or hasattr(obj, "__cuda_array_interface__")):
            return span
        if span.kind == N.MEM_PINNED and span.owner is not None:
            return span
        try:
            key = id(obj)
            ref = weakref.ref(obj, lambda r, k=key: self._drop(k, r))
            owner_ref = weakref.ref(span.owner) if span.owner is not None else None
        except TypeError:  # not weak-referenceable
            return span
        if len(self._memo) >= self.MAX:
            self._memo.clear()
        self._memo[key] = (ref, span.ptr, span.nbytes, span.kind, span.gpu, None if is_np else span.readonly,
                           owner_ref, span.owner_ptr, span.owner_nbytes)
        return span

    def _drop(self, key: int, ref: Any) -> None:
        hit = self._memo.get(key)
        if hit is not None and hit[0] is ref:
            del self._memo[key]
