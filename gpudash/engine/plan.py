"""What a copy() call resolves to: direction, GPU, pointers and the host side, checked once (sizes,
overlap, read-only, both-host or both-device). Plans of whole-buffer copies between two arrays are
memoized per (dst, src) pair, so copying the same arrays again costs one dict look-up instead of
resolving and checking both buffers: a small copy takes ~10 us, and Python work shows in it."""

from __future__ import annotations

import weakref
from typing import Any, Callable, NamedTuple

import numpy as np

from gpudash.engine import _native as N
from gpudash.engine.buffers import DeviceBuffer, Span
from gpudash.engine.errors import EngineArgumentError


class CopyPlan(NamedTuple):
    """A validated copy. It holds no strong reference to the caller's arrays (memoized plans must not
    keep them alive): the caller keeps them for the copy's lifetime."""

    direction: int  # N.H2D | N.D2H (this and gpu, nbytes: also in desc, read here without ctypes)
    gpu: int
    nbytes: int
    host_kind: int  # N.MEM_PINNED | N.MEM_PAGEABLE
    owner_ref: Any  # weakref to the numpy array owning the host memory (registration cache key), or None
    owner_ptr: int
    owner_nbytes: int
    devbufs: tuple[DeviceBuffer, ...]  # engine buffers counted in flight while the copy runs
    desc: N.CopyDescC  # the same for the C ABI (read-only there: one plan may serve several threads)

    def host_owner(self) -> Any:
        return self.owner_ref() if self.owner_ref is not None else None


Resolve = Callable[[Any, str, "int | None"], Span]


def plan_copy(dst: Any, src: Any, nbytes: int | None, resolve: Resolve, num_gpus: int,
              check_gpu: Callable[[Any, str], int]) -> CopyPlan:
    """Resolve and check both buffers; EngineArgumentError naming the argument and the fix."""
    d = resolve(dst, "dst", nbytes)
    s = resolve(src, "src", nbytes)
    n = s.nbytes if nbytes is None else nbytes
    if d.nbytes < n or s.nbytes < n:
        span, arg = (d, "dst") if d.nbytes < n else (s, "src")
        raise EngineArgumentError(f"{arg} is too small: it holds {span.nbytes} bytes and the copy needs {n}; "
                                  f"pass a larger {arg} or a smaller nbytes")
    if d.readonly:
        raise EngineArgumentError("dst is read-only; pass a writable array or buffer")
    if n and d.ptr < s.ptr + n and s.ptr < d.ptr + n:
        raise EngineArgumentError("dst and src overlap; pass separate buffers")
    if d.kind == N.MEM_DEVICE and s.kind != N.MEM_DEVICE:
        direction, gpu, host = N.H2D, d.gpu, s
    elif s.kind == N.MEM_DEVICE and d.kind != N.MEM_DEVICE:
        direction, gpu, host = N.D2H, s.gpu, d
    elif s.kind == N.MEM_DEVICE:
        raise EngineArgumentError("dst and src are both GPU memory; this engine copies between host and GPU")
    else:
        raise EngineArgumentError("dst and src are both host memory; one of them must be GPU memory "
                                  "(a DeviceBuffer, CuPy array or torch CUDA tensor)")
    if type(gpu) is not int or not 0 <= gpu < num_gpus:
        gpu = check_gpu(gpu, "the GPU of " + ("dst" if direction == N.H2D else "src"))
    devbufs = tuple(b for b in (dst, src) if isinstance(b, DeviceBuffer))
    owner_ref = weakref.ref(host.owner) if host.owner is not None else None
    return CopyPlan(direction, gpu, n, host.kind, owner_ref, host.owner_ptr, host.owner_nbytes, devbufs,
                    N.CopyDescC(direction, gpu, d.ptr, s.ptr, n))


def _memoizable(obj: Any) -> bool:
    """Arrays whose pointer, size and memory kind are fixed while they live (not engine buffers, which
    can be freed, nor raw pointers or other buffer objects)."""
    return (isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__")) and \
        not isinstance(obj, DeviceBuffer)


class PlanCache:
    """(id(dst), id(src)) -> plan of a whole-buffer copy, held through weak references only: an entry
    goes when either array does. Not memoized: numpy-owned memory that is pinned (it may be a
    registration that the registration cache later drops, changing its kind)."""

    MAX = 4096

    def __init__(self) -> None:
        self._memo: dict[tuple[int, int], tuple[Any, Any, CopyPlan, bool]] = {}
        self._missed: tuple[int, int] | None = None  # the pair of the last miss

    def get(self, dst: Any, src: Any) -> CopyPlan | None:
        """The memoized plan, or None (then plan_copy() and put())."""
        hit = self._memo.get((id(dst), id(src)))
        if hit is None:
            return None
        dref, sref, plan, dst_numpy = hit
        if dref() is not dst or sref() is not src:
            return None
        if dst_numpy and not dst.flags.writeable:  # numpy's writeable flag can change: plan_copy says why
            return None
        return plan

    def put(self, dst: Any, src: Any, plan: CopyPlan) -> None:
        """Memoize `plan` once the same pair misses twice in a row (a one-shot buffer's pair is never
        seen again: its weak references would be wasted work)."""
        key = (id(dst), id(src))
        if key != self._missed:
            self._missed = key
            return
        if not (_memoizable(dst) and _memoizable(src)):
            return
        if plan.host_kind == N.MEM_PINNED and plan.owner_ref is not None:
            return
        try:
            dref = weakref.ref(dst, lambda r, k=key: self._drop(k, r))
            sref = weakref.ref(src, lambda r, k=key: self._drop(k, r))
        except TypeError:  # not weak-referenceable
            return
        if len(self._memo) >= self.MAX:
            self._memo.clear()
        self._memo[key] = (dref, sref, plan, isinstance(dst, np.ndarray))

    def _drop(self, key: tuple[int, int], ref: Any) -> None:
        hit = self._memo.get(key)
        if hit is not None and (hit[0] is ref or hit[1] is ref):
            del self._memo[key]
