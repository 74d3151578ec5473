"""TransferEngine: the Python face of the data plane. Python owns policy (which host path, what to
cache), configuration and validation; every byte moves in C++ (csrc/)."""

from __future__ import annotations

import ctypes
import operator
import threading
import weakref
from dataclasses import replace
from typing import Any

import numpy as np

from gpudash.engine import _native as N
from gpudash.engine.buffers import DeviceBuffer, HostBuffer, Span, SpanCache, page_aligned
from gpudash.engine.config import KNOBS, SIM_REAL_GBPS, EngineConfig, validate_knobs
from gpudash.engine.errors import EngineArgumentError, EngineError
from gpudash.engine.gate import CLOSING, FREED, OPEN, CallGate, closed_error, gated
from gpudash.engine.plan import CopyPlan, PlanCache, plan_copy
from gpudash.engine.pools import EnginePool
from gpudash.engine.profiles import get_profile, pcie_payload_gbps
from gpudash.engine.regcache import RegistrationCache
from gpudash.engine.results import CopyInfo, EngineStats, GpuInfo, LinkStats, PathStats, Topology

_DIR_NAME = {N.H2D: "h2d", N.D2H: "d2h"}
_STAGING_KNOB = {N.H2D: "h2d_staging_bytes", N.D2H: "d2h_staging_bytes"}
PAGEABLE_POLICIES = ("auto", "stage", "register", "driver")


def path_name(gpu: int, via: int, direction: int) -> str:
    """``direct:G`` or ``relay:A->B`` with A->B in the order the bytes flow."""
    if via == gpu:
        return f"direct:{gpu}"
    return f"relay:{via}->{gpu}" if direction == N.H2D else f"relay:{gpu}->{via}"


def _stream_ptr(stream: Any) -> int:
    """CUstream from a CuPy/torch stream object or an int; the legacy default stream becomes 0x1."""
    if isinstance(stream, bool):
        raise EngineArgumentError("stream must be a CuPy/torch stream or a CUstream integer, got a boolean")
    for attr in ("ptr", "cuda_stream"):
        if hasattr(stream, attr):
            stream = getattr(stream, attr)
            break
    if not isinstance(stream, int) or stream < 0:
        raise EngineArgumentError(f"stream must be a CuPy/torch stream or a CUstream integer, got {stream!r}")
    return stream or 1


def _as_int(value: Any) -> int | None:
    """`value` as an int (numpy integers too), or None for non-integers and booleans."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _positive(nbytes: Any) -> int:
    n = _as_int(nbytes)
    if n is None or n <= 0:
        raise EngineArgumentError(f"nbytes must be a positive integer, got {nbytes!r}")
    if n >= 2**63:  # no memory is that large, and the C ABI's sizes end there
        raise EngineArgumentError(f"nbytes={n} is larger than any memory (the limit is 2**63 - 1)")
    return n


class CopyHandle:
    """A copy in flight: `wait()` blocks (and raises if it failed), `done()` polls. A synchronous copy's
    handle is born finished."""

    __slots__ = ("_eng", "_h", "_info", "_keep", "_reg_key", "_devbufs", "_lock", "_rc", "_result")

    def __init__(self, eng: "TransferEngine", handle: int, info: tuple[str, int, int, str], keep: tuple[Any, ...],
                 reg_key: int | None, devbufs: tuple[DeviceBuffer, ...]):
        self._eng = eng
        self._h = handle  # 0: synchronous copy, nothing to wait for
        self._info = info  # direction, gpu, nbytes, host mode
        self._keep = keep  # the buffers stay alive while the copy runs
        self._reg_key = reg_key
        self._devbufs = devbufs
        self._lock = threading.Lock() if handle else None
        self._rc: int | None = None
        self._result: CopyInfo | None = None

    @classmethod
    def _landed(cls, result: CopyInfo) -> "CopyHandle":
        """The handle of a synchronous copy that landed and holds nothing (its registration already
        released, no engine buffer): only what done() and wait() read is set; built for every small
        copy, so kept cheap."""
        h = cls.__new__(cls)
        h._h, h._rc, h._result = 0, N.OK, result
        return h

    def _finish(self, rc: int, chunks: int, paths_used: int) -> None:
        self._result = CopyInfo(*self._info, chunks, paths_used)
        if self._reg_key is not None:
            self._eng._regcache.release(self._reg_key)
        for b in self._devbufs:
            b.in_flight -= 1
        self._keep = ()
        self._rc = rc
        if self._h:
            self._eng._forget(self)

    def _poll(self, timeout_s: float) -> bool:
        if self._rc is not None:
            return True
        with self._lock:
            if self._rc is not None:
                return True
            chunks, used = ctypes.c_uint64(), ctypes.c_int()
            rc = self._eng._c_finish(self._eng._ptr, self._h, timeout_s, ctypes.byref(chunks), ctypes.byref(used))
            if rc == N.ETIMEOUT:
                return False
            self._finish(rc, chunks.value, used.value)
            return True

    def done(self) -> bool:
        """True once the copy has finished (successfully or not; wait() raises the error)."""
        return self._poll(0.0)

    def wait(self, timeout: float | None = None) -> CopyInfo:
        """Block until the copy lands; EngineError if it failed, TimeoutError after `timeout` seconds."""
        if self._rc is None:
            if timeout is None:
                self._poll(-1.0)  # one unbounded C wait (it may complete the copy in this thread)
            else:
                waited = 0.0
                while not self._poll(min(1.0, max(timeout - waited, 0.0))):
                    waited += 1.0
                    if waited >= timeout:
                        raise TimeoutError(f"copy of {self._info[2]} bytes still running after {timeout} s")
        if self._rc == N.ECLOSED:
            raise closed_error()
        if self._rc != N.OK:
            name = N.error_name(self._rc)
            raise EngineError(f"{self._info[0]} copy of {self._info[2]} bytes to/from GPU {self._info[1]} "
                              f"failed: {name}", self._rc, name)
        assert self._result is not None
        return self._result


class TransferEngine:
    """Multipath host<->GPU copies over the sim or CUDA backend (the design: gpudash/engine/__init__.py; the data
    plane: csrc/README.md). Thread-safe, close() included (see close()); the raw `_ptr` is not guarded:
    whoever takes it must drop it then."""

    def __init__(self, config: EngineConfig | None = None, **overrides: Any):
        cfg = config or EngineConfig()
        if overrides:
            cfg = replace(cfg, **overrides)
        self.config = cfg
        self.backend = cfg.backend
        self._knobs = cfg.knobs()
        self._lock = threading.Lock()
        self._inflight: set[CopyHandle] = set()
        self._gate = CallGate()
        self._close_lock = threading.Lock()
        self._ptr = ctypes.c_void_p()
        kn = N.Knobs.of(self._knobs)
        self.profile = cfg.profile if cfg.backend == "sim" else None
        self._sim_device: dict[int, tuple[int, int]] = {}  # sim device memory held: ptr -> (gpu, bytes)
        self._sim_lock = threading.RLock()  # re-entrant: a buffer's finalizer may run inside it (GC)
        if cfg.backend == "sim":
            rig = get_profile(cfg.profile)
            n = len(rig.gpus)
            links = [g.link_gbps for g in rig.gpus]
            self.time_scale = cfg.sim_time_scale or max(1.0, sum(links) / SIM_REAL_GBPS)
            peer = [rig.peer_gbps(a, b) or 0.0 for a in range(n) for b in range(n)]
            arr = ctypes.c_double * n
            rc = N.call("ge_create_sim", n, arr(*links), arr(*[g.link_latency_us for g in rig.gpus]),
                        (ctypes.c_double * (n * n))(*peer), rig.nvlink_gbps or 0.0, self.time_scale,
                        ctypes.byref(kn), ctypes.byref(self._ptr))
            self._rig = rig
            self._link_state = [[g.link_gen, g.link_width] for g in rig.gpus]
        else:
            self.time_scale = 1.0
            rc = N.call("ge_create_cuda", ctypes.byref(kn), ctypes.byref(self._ptr))
        N.check(rc, f"creating the {cfg.backend} engine")
        self.num_gpus = N.call("ge_num_gpus", self._ptr)
        lib = N.lib()  # hot calls, bound once
        self._c_classify, self._c_kind = lib.ge_classify, lib.ge_kind
        self._c_copy, self._c_copy_sync, self._c_finish = lib.ge_copy, lib.ge_copy_sync, lib.ge_finish
        self._spans = SpanCache()
        self._plans = PlanCache()
        self._tls = threading.local()
        self._regcache = RegistrationCache(self._register, self._unregister, self._knobs["registration_cache_bytes"])
        self._path_meta = [(p.gpu, p.via, p.direction) for p in self._raw_stats()[0]]
        raw = {w: self._pool_raw(w) for w in range(-1, self.num_gpus)}
        self._pools = {p.name: p for p in (EnginePool(self, w, r[:5]) for w, r in raw.items() if r[0])}

    # ---- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """From now on every public call raises EngineError ('the engine is closed'); the calls and
        copies in flight finish (their waiters get the result), cached registrations are dropped, and
        then the native engine is freed. Idempotent; any thread may call it, except from inside one of
        this engine's calls."""
        with self._close_lock:
            if self._gate.state == FREED:
                return
            self._gate.shut(CLOSING)  # the copy() calls inside have left: every async copy has its handle
            with self._lock:
                flying = list(self._inflight)
            for h in flying:
                try:
                    h.wait()
                except EngineError:
                    pass
            self._regcache.clear()
            for pool in self._pools.values():
                pool.close()
            self._gate.shut(FREED)  # the clean-up calls (finalizers on other threads) have left
            N.call("ge_destroy", self._ptr)

    def __enter__(self) -> "TransferEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True from the moment close() begins."""
        return self._gate.state != OPEN

    def _check_open(self) -> None:
        if self._gate.state != OPEN:
            raise closed_error()

    def _forget(self, h: CopyHandle) -> None:
        with self._lock:
            self._inflight.discard(h)

    # ---- memory -----------------------------------------------------------------------------
    def _kind(self, ptr: int) -> tuple[int, int | None, int]:
        """Like _classify without the extent (one cheap call, for buffers whose size is known)."""
        v = self._c_kind(self._ptr, ptr)
        if v < 0:
            N.check(v, f"looking up pointer {ptr:#x}")
        gpu = (v & 255) - 1
        return v >> 8, (gpu if gpu >= 0 else None), 0

    def _classify(self, ptr: int) -> tuple[int, int | None, int]:
        kind, gpu, avail = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint64()
        rc = self._c_classify(self._ptr, ptr, ctypes.byref(kind), ctypes.byref(gpu), ctypes.byref(avail))
        if rc:
            N.check(rc, f"looking up pointer {ptr:#x}")
        return kind.value, (gpu.value if gpu.value >= 0 else None), avail.value

    def _register(self, ptr: int, nbytes: int) -> bool:
        return N.call("ge_host_register", self._ptr, ptr, nbytes) == N.OK  # only ever inside copy()

    def _unregister(self, ptr: int) -> None:
        if self._gate.enter_cleanup():  # else the freed engine dropped every registration itself
            try:
                N.call("ge_host_unregister", self._ptr, ptr)
            finally:
                self._gate.leave()

    def _check_gpu(self, gpu: Any, arg: str = "gpu") -> int:
        gpu = _as_int(gpu)
        if gpu is None or not 0 <= gpu < self.num_gpus:
            raise EngineArgumentError(f"{arg}={gpu!r} does not exist; this engine has {self.num_gpus} GPU(s), "
                                      f"numbered 0..{self.num_gpus - 1}")
        return gpu

    @gated
    def alloc_device(self, gpu: int, nbytes: int) -> DeviceBuffer:
        """Device memory on `gpu` (host memory standing in for it on the sim backend)."""
        self._check_gpu(gpu)
        nbytes = _positive(nbytes)
        if self.backend == "sim":
            arr, ptr_sim = self._sim_storage(nbytes, N.MEM_DEVICE, gpu)
            return DeviceBuffer(self._untrack_device, ptr_sim, nbytes, gpu, arr)
        ptr = ctypes.c_uint64()
        N.check(N.call("ge_alloc_device", self._ptr, gpu, nbytes, ctypes.byref(ptr)),
                f"allocating {nbytes} bytes on GPU {gpu}")
        return DeviceBuffer(self._free_device, ptr.value, nbytes, gpu)

    @gated
    def alloc_host(self, nbytes: int) -> HostBuffer:
        """Pinned host memory (page-locked on cuda)."""
        nbytes = _positive(nbytes)
        if self.backend == "sim":
            arr, ptr_sim = self._sim_storage(nbytes, N.MEM_PINNED, -1)
            return HostBuffer(self._untrack_host, ptr_sim, nbytes, -1, arr)
        ptr = ctypes.c_uint64()
        N.check(N.call("ge_alloc_host", self._ptr, nbytes, ctypes.byref(ptr)), f"allocating {nbytes} pinned bytes")
        return HostBuffer(self._free_host, ptr.value, nbytes, -1)

    def _sim_storage(self, nbytes: int, kind: int, gpu: int) -> tuple[np.ndarray, int]:
        """sim: numpy memory standing in for device/pinned memory, tracked by the sim until freed or,
        if the buffer is dropped without free(), until numpy frees the memory (so a later allocation
        at the same address is never mistaken for it)."""
        what = f"allocating {nbytes} bytes on GPU {gpu}" if kind == N.MEM_DEVICE else f"allocating {nbytes} pinned bytes"
        with self._sim_lock:
            if kind == N.MEM_DEVICE:  # a simulated card holds what its profile says, as a real one would
                card = self._rig.gpus[gpu]
                held = sum(n for g, n in self._sim_device.values() if g == gpu)
                if held + nbytes > card.memory_bytes:
                    raise EngineError(f"{what}: out of memory (GPU {gpu}, sim {card.name}, holds {card.memory_bytes} "
                                      f"bytes, {held} in use)", N.ENOMEM, "GE_ENOMEM")
            try:
                arr = page_aligned(nbytes)
            except (MemoryError, ValueError):
                raise EngineError(f"{what}: out of memory (the host memory standing in for it)", N.ENOMEM,
                                  "GE_ENOMEM") from None
            ptr = arr.__array_interface__["data"][0]
            N.check(N.call("ge_sim_track", self._ptr, ptr, nbytes, kind, gpu), what)
            if kind == N.MEM_DEVICE:
                self._sim_device[ptr] = (gpu, nbytes)
        fin = weakref.finalize(arr.base, self._sim_untrack, ptr, kind)
        fin.atexit = False
        return arr, ptr

    def _sim_untrack(self, ptr: int, kind: int) -> None:
        if kind == N.MEM_DEVICE:
            with self._sim_lock:
                self._sim_device.pop(ptr, None)
        if self._gate.enter_cleanup():  # else the engine is freed, and its tracking with it
            try:
                N.call("ge_sim_untrack", self._ptr, ptr, kind)  # already untracked by free(): nothing to do
            finally:
                self._gate.leave()

    def _untrack_device(self, ptr: int) -> None:
        self._sim_untrack(ptr, N.MEM_DEVICE)

    def _untrack_host(self, ptr: int) -> None:
        self._sim_untrack(ptr, N.MEM_PINNED)

    def _free_device(self, ptr: int) -> None:
        self._free("ge_free_device", ptr, "freeing a device buffer")

    def _free_host(self, ptr: int) -> None:
        self._free("ge_free_host", ptr, "freeing a pinned host buffer")

    def _free(self, fn: str, ptr: int, what: str) -> None:
        if self._gate.enter_cleanup():  # else the freed engine gave back all its memory itself
            try:
                N.check(N.call(fn, self._ptr, ptr), what)
            finally:
                self._gate.leave()

    # ---- the engine's own pools ---------------------------------------------------------------
    def pools(self) -> dict[str, EnginePool]:
        """The pools holding the engine's staging slots (``engine-host``, shard ``staging``) and relay
        buffers (``engine-gpuN``, shard ``relay``, for each GPU some relay path runs through), labelled
        after the backend. The engine owns them; views taken earlier read as closed once it closes."""
        self._check_open()
        return dict(self._pools)

    def _pool_raw(self, which: int) -> tuple[ctypes.c_void_p, int, int, int, int, int]:
        """(pool pointer, shard id, base, size, granule, floor) of engine pool `which` (-1: host)."""
        ptr, shard = ctypes.c_void_p(), ctypes.c_int()
        base, size, granule, floor = (ctypes.c_uint64() for _ in range(4))
        N.check(N.call("ge_engine_pool", self._ptr, which, ctypes.byref(ptr), ctypes.byref(shard), ctypes.byref(base),
                       ctypes.byref(size), ctypes.byref(granule), ctypes.byref(floor)), "reading an engine pool")
        return ptr, shard.value, base.value, size.value, granule.value, floor.value

    @gated
    def _pool_floor(self, which: int) -> int:
        """Shard bytes the engine needs in pool `which` (the most any knob setting so far asked for)."""
        return self._pool_raw(which)[5]

    def _pool_refusal(self, knobs: N.Knobs, changed: dict[str, Any]) -> str:
        """Why ge_set_knobs refused `knobs`: the first engine pool too small for one chunk per relay path."""
        asked = ", ".join(f"{k}={v}" for k, v in changed.items())
        for pool in self._pools.values():
            which, need = -1 if pool.gpu is None else pool.gpu, ctypes.c_uint64()
            N.check(N.call("ge_pool_need", self._ptr, ctypes.byref(knobs), which, ctypes.byref(need)), "sizing a pool")
            if need.value > pool.nbytes:
                return (f"knobs {asked} refused: one chunk on each relay path needs {need.value} bytes in shard "
                        f"{pool.shards[0]!r} of pool {pool.name!r}, whose memory holds {pool.nbytes} bytes (sized "
                        f"when the engine was made); use smaller chunk sizes, or make a new engine with them")
        return f"knobs {asked} refused: an engine pool is too small for them"

    # ---- copies -------------------------------------------------------------------------------
    def copy(self, dst: Any, src: Any, nbytes: int | None = None, stream: Any = None,
             pageable: str = "auto", paths: str = "auto", sync: bool = False) -> CopyHandle:
        """Copy host->GPU or GPU->host (decided from the buffers). `nbytes` defaults to all of src.
        With `stream` (cuda), the copy starts after work queued there and later work there waits for it.
        `sync=True` returns only once the copy has landed (raising if it failed); a single-path copy
        is then one driver copy and one stream sync on this thread, and the handle is born finished.
        `pageable` overrides the policy for pageable host memory: "auto" (one-shot buffers: a driver
        copy below the `*_staging_bytes` knob, the staging ring above; reused ones: register once),
        "stage" (always the staging ring), "register" (pin through the cache now) or "driver" (one
        plain driver copy on the direct path). `paths="direct"` keeps the copy on the single direct
        path with no chunking (the baseline)."""
        gate = self._gate  # inside the gate as @gated does, spelled out: this is the hot path
        gate.enter()
        try:
            return self._copy(dst, src, nbytes, stream, pageable, paths, sync)
        finally:
            gate.leave()

    def _copy(self, dst: Any, src: Any, nbytes: int | None, stream: Any, pageable: str, paths: str,
              sync: bool) -> CopyHandle:
        if paths not in ("auto", "direct"):
            raise EngineArgumentError(f"paths must be 'auto' or 'direct', got {paths!r}")
        if pageable not in PAGEABLE_POLICIES:
            raise EngineArgumentError(f"pageable must be one of {', '.join(map(repr, PAGEABLE_POLICIES))}, "
                                      f"got {pageable!r}")
        plan = self._plans.get(dst, src) if nbytes is None else None
        if plan is None:
            plan = self._plan(dst, src, nbytes)
        cu_stream = 0
        if stream is not None:
            if self.backend != "cuda":
                raise EngineArgumentError("stream= needs backend='cuda'; the sim backend has no streams")
            cu_stream = _stream_ptr(stream)
        direction, gpu, n, host_kind, owner_ref, _optr, _onb, devbufs, desc = plan
        if host_kind == N.MEM_PINNED and owner_ref is None:  # not ours to register: as it is
            mode, mode_name, reg_key = N.HOST_DIRECT, "pinned", None
        else:
            mode, mode_name, reg_key = self._host_path(plan, pageable)
        for b in devbufs:
            b.in_flight += 1
        flags = mode | (N.COPY_DIRECT_ONLY if paths == "direct" else 0)
        info = (_DIR_NAME[direction], gpu, n, mode_name)
        if sync:
            try:
                out = self._tls.out  # this thread's (chunks, paths used): no allocation per copy
            except AttributeError:
                out = self._tls.out = (ctypes.c_uint64 * 2)()
            rc = self._c_copy_sync(self._ptr, desc, flags, cu_stream, out)
            if rc == N.OK and not devbufs:
                if reg_key is not None:
                    self._regcache.release(reg_key)
                return CopyHandle._landed(CopyInfo(*info, out[0], out[1]))
            h = CopyHandle(self, 0, info, (), reg_key, devbufs)
            h._finish(rc, out[0], out[1])
            if rc != N.OK:
                h.wait()  # raises the copy's error
            return h
        handle = ctypes.c_uint64()
        rc = self._c_copy(self._ptr, desc, flags, cu_stream, ctypes.byref(handle))
        if rc != N.OK:
            for b in devbufs:
                b.in_flight -= 1
            if reg_key is not None:
                self._regcache.release(reg_key)
            N.check(rc, f"starting a {info[0]} copy of {n} bytes")
        h = CopyHandle(self, handle.value, info, (dst, src), reg_key, devbufs)
        with self._lock:
            self._inflight.add(h)
        return h

    def _plan(self, dst: Any, src: Any, nbytes: Any) -> CopyPlan:
        """Resolve and check a copy's buffers (memoized for whole-buffer copies between arrays)."""
        if nbytes is not None:
            n_ = _as_int(nbytes)
            if n_ is None or n_ < 0:
                raise EngineArgumentError(f"nbytes must be an integer >= 0, got {nbytes!r}")
            nbytes = n_
        if self.backend != "cuda" and (hasattr(dst, "__cuda_array_interface__") or
                                       hasattr(src, "__cuda_array_interface__")):
            raise EngineArgumentError("CuPy arrays and torch CUDA tensors need backend='cuda'; on the sim backend "
                                      "use alloc_device() buffers")
        plan = plan_copy(dst, src, nbytes, self._resolve, self.num_gpus, self._check_gpu)
        if nbytes is None:
            self._plans.put(dst, src, plan)
        return plan

    def _resolve(self, obj: Any, arg: str, nbytes: int | None) -> Span:
        return self._spans.resolve(obj, arg, nbytes, self._classify, self._kind)

    def _host_path(self, plan: CopyPlan, pageable: str) -> tuple[int, str, int | None]:
        """(host mode flags, its name, registration key or None) for the host side of `plan`. Our own
        registrations are taken first, whatever the policy, so eviction cannot unpin them under the copy;
        new ones are made only under the "auto" and "register" policies."""
        reg_key = None
        if plan.owner_ref is not None:
            reg_key = self._regcache.hold(plan.owner_ptr, plan.owner_nbytes)
            if reg_key is None and pageable in ("auto", "register"):
                reg_key = self._regcache.acquire(plan.host_owner(), plan.owner_ptr, plan.owner_nbytes,
                                                 pageable == "register")
        if reg_key is not None:
            return N.HOST_DIRECT, "registered", reg_key
        if plan.host_kind == N.MEM_PINNED:
            return N.HOST_DIRECT, "pinned", None
        if pageable == "driver" or (pageable == "auto" and plan.nbytes < self._knobs[_STAGING_KNOB[plan.direction]]):
            return N.HOST_DIRECT | N.COPY_DIRECT_ONLY, "driver", None
        return N.HOST_STAGED, "staged", None

    def h2d(self, dst_dev: Any, src_host: Any, nbytes: int | None = None, stream: Any = None,
            sync: bool = False) -> CopyHandle:
        """copy() that insists on host -> GPU."""
        if self._is_device(src_host):
            raise EngineArgumentError("h2d(): src_host is GPU memory; use d2h() or copy()")
        return self.copy(dst_dev, src_host, nbytes, stream, sync=sync)

    def d2h(self, dst_host: Any, src_dev: Any, nbytes: int | None = None, stream: Any = None,
            sync: bool = False) -> CopyHandle:
        """copy() that insists on GPU -> host."""
        if self._is_device(dst_host):
            raise EngineArgumentError("d2h(): dst_host is GPU memory; use h2d() or copy()")
        return self.copy(dst_host, src_dev, nbytes, stream, sync=sync)

    @staticmethod
    def _is_device(obj: Any) -> bool:
        return (isinstance(obj, DeviceBuffer) and not isinstance(obj, HostBuffer)) or \
            hasattr(obj, "__cuda_array_interface__")

    # ---- knobs ----------------------------------------------------------------------------------
    @gated
    def set(self, **knobs: Any) -> dict[str, Any]:
        """Change knobs live; all are validated first, so a bad value changes nothing. Copies in flight
        keep the settings they started with; knobs whose chunks would not fit the engine's pools are
        refused (EngineArgumentError naming the pool and sizes). Returns the new knob values."""
        checked = validate_knobs(knobs)
        with self._lock:
            new = {**self._knobs, **checked}
            struct = N.Knobs.of(new)
            rc = N.call("ge_set_knobs", self._ptr, ctypes.byref(struct))
            if rc == N.ENOMEM:
                raise EngineArgumentError(self._pool_refusal(struct, checked), rc, "GE_ENOMEM")
            N.check(rc, "setting knobs")
            self._knobs = new
            self._regcache.set_cap(new["registration_cache_bytes"])
            return dict(new)

    def knobs(self) -> dict[str, Any]:
        self._check_open()
        with self._lock:
            return dict(self._knobs)

    # ---- observation ------------------------------------------------------------------------------
    def _raw_stats(self) -> tuple[Any, Any]:
        n = N.call("ge_num_paths", self._ptr)
        paths = (N.PathStatsC * n)()
        links = (N.LinkStatsC * self.num_gpus)()
        N.call("ge_stats", self._ptr, paths, n, links, self.num_gpus)
        return paths, links

    @gated
    def now(self) -> float:
        """Backend clock in seconds (simulated seconds on sim)."""
        return N.call("ge_now", self._ptr)

    @gated
    def stats(self) -> EngineStats:
        """Per-path and per-link counters; cheap enough for every telemetry tick."""
        paths, links = self._raw_stats()
        ps = tuple(PathStats(path_name(p.gpu, p.via, p.direction), p.gpu, None if p.via == p.gpu else p.via,
                             _DIR_NAME[p.direction], p.bytes, p.chunks, p.queue_depth, p.gbps, p.cpu_s,
                             bool(p.failed)) for p in paths)
        ls = tuple(LinkStats(l.gpu, l.h2d_bytes, l.d2h_bytes) for l in links)
        with self._lock:
            knobs = dict(self._knobs)
        return EngineStats(self.backend, N.call("ge_now", self._ptr), ps, ls, knobs)

    @gated
    def topology(self) -> Topology:
        gpus = []
        for i in range(self.num_gpus):
            if self.backend == "sim":
                g = self._rig.gpus[i]
                gen, width = self._link_state[i]
                gpus.append(GpuInfo(i, g.name, gen, width, g.link_gen, g.link_width, pcie_payload_gbps(gen, width)))
            else:
                buf = ctypes.create_string_buffer(256)
                N.call("ge_device_name", self._ptr, i, buf, 256)
                gpus.append(GpuInfo(i, buf.value.decode(), None, None, None, None, None))
        peer = []
        for a in range(self.num_gpus):
            row = []
            for b in range(self.num_gpus):
                v = ctypes.c_double()
                N.call("ge_peer_gbps", self._ptr, a, b, ctypes.byref(v))
                row.append(None if v.value == 0 else max(v.value, 0.0))
            peer.append(tuple(row))
        names = tuple(dict.fromkeys(path_name(g, v, d) for g, v, d in self._path_meta))
        return Topology(self.backend, self.profile, tuple(gpus), names, tuple(peer))

    # ---- sim rig controls -------------------------------------------------------------------------
    def _sim_only(self, what: str) -> None:
        if self.backend != "sim":
            raise EngineArgumentError(f"{what} works on the sim backend only")

    @gated
    def set_link(self, gpu: int, gen: int | None = None, width: int | None = None) -> None:
        """sim: run GPU `gpu`'s host link at PCIe gen/width (None: its maximum), both directions."""
        self._sim_only("set_link()")
        self._check_gpu(gpu)
        g = self._rig.gpus[gpu]
        gen = g.link_gen if gen is None else gen
        width = g.link_width if width is None else width
        if isinstance(gen, bool) or not isinstance(gen, int) or not 1 <= gen <= g.link_gen:
            raise EngineArgumentError(f"gen={gen!r} is out of range for GPU {gpu}; it must be in [1, {g.link_gen}]")
        if width not in (1, 2, 4, 8, 16) or width > g.link_width:
            raise EngineArgumentError(f"width={width!r} is not valid for GPU {gpu}; use 1, 2, 4, 8 or 16, "
                                      f"at most {g.link_width}")
        N.check(N.call("ge_sim_set_link", self._ptr, gpu, pcie_payload_gbps(gen, width)), "setting a sim link")
        self._link_state[gpu] = [gen, width]

    @gated
    def inject_fault(self, gpu: int, via: int | None = None, direction: str = "h2d", fail: bool = True) -> None:
        """sim: make path (gpu, via, direction) fail its chunks (fail=False heals it)."""
        self._sim_only("inject_fault()")
        self._check_gpu(gpu)
        via = gpu if via is None else self._check_gpu(via, "via")
        if direction not in ("h2d", "d2h"):
            raise EngineArgumentError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        d = N.H2D if direction == "h2d" else N.D2H
        if (gpu, via, d) not in self._path_meta:
            raise EngineArgumentError(f"there is no path from GPU {via} to GPU {gpu} on this rig")
        N.check(N.call("ge_sim_fail_path", self._ptr, gpu, via, d, int(fail)), "injecting a fault")

    @property
    def knob_names(self) -> tuple[str, ...]:
        return KNOBS

    def __repr__(self) -> str:
        where = f"sim:{self.profile}" if self.backend == "sim" else "cuda"
        return f"TransferEngine({where}, {self.num_gpus} GPU(s){', closed' if self.closed else ''})"
