"""Engine vs native copies, side by side (`gpudash bench engine`, benchmarks/bench_engine.py).

On cuda the native baseline is cudaMemcpyAsync through CuPy on the very same buffers, and times are
wall-clock. On sim there is no CUDA: the baseline is the same engine forced onto the single direct path
with no chunking ("sim single-path"), times are simulated seconds, and every row is labelled sim. The
sim does not model the pageable-memory penalty, so its pageable rows only show the multipath gain.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpudash.engine.errors import EngineError
from gpudash.engine.transfer import TransferEngine

KiB, MiB, GiB = 2**10, 2**20, 2**30
CUDA_SIZES = (64 * KiB, 1 * MiB, 2 * MiB, 8 * MiB, 64 * MiB, 256 * MiB, 1 * GiB)
SIM_SIZES = (64 * KiB, 1 * MiB, 8 * MiB, 64 * MiB, 256 * MiB)
MEMORY = ("pinned", "pageable one-shot", "pageable reused")
HUGE = 2**50


@dataclass(frozen=True)
class BenchRow:
    direction: str
    memory: str
    size: int
    engine_gbps: float
    native_gbps: float
    ratio: float
    vs_pinned_native: float  # engine / native pinned at this size and direction
    engine_core_s_per_gb: float
    native_core_s_per_gb: float
    engine_path: str  # how the engine reached host memory: pinned | registered | staged | driver
    reps: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RelayFigure:
    """sim: copies into one GPU over its direct link plus every relay, against the link model's aggregate."""

    profile: str
    target: int
    relays: int
    measured_gbps: float
    model_gbps: float

    @property
    def percent(self) -> float:
        return 100.0 * self.measured_gbps / self.model_gbps


def reps_for(size: int) -> int:
    """Repetitions per row: a small copy takes ~10 us and its median needs many to settle within ~1%."""
    return 201 if size <= 2 * MiB else 51 if size <= 8 * MiB else 7 if size <= 256 * MiB else 5


class _CudaSide:
    """Buffers from CuPy and the native cudaMemcpyAsync baseline."""

    label = "native cudaMemcpyAsync (CuPy)"

    def __init__(self, eng: TransferEngine):
        import cupy
        import cupyx

        self.cp, self.cpx, self.eng = cupy, cupyx, eng
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def device(self, n: int) -> Any:
        return self.cp.empty(n, dtype=self.cp.uint8)

    def pinned(self, n: int) -> Any:
        a = self.cpx.empty_pinned((n,), dtype=np.uint8)
        a[:] = 1
        return a

    @staticmethod
    def _ptr(a: Any) -> int:
        return a.data.ptr if hasattr(a, "data") and hasattr(a.data, "ptr") else a.ctypes.data

    def native(self, dst: Any, src: Any, n: int, h2d: bool) -> None:
        kind = 1 if h2d else 2  # cudaMemcpyHostToDevice / DeviceToHost
        self.cp.cuda.runtime.memcpyAsync(self._ptr(dst), self._ptr(src), n, kind, self.stream.ptr)
        self.stream.synchronize()

    def clock(self) -> float:
        return time.perf_counter()


class _SimSide:
    """Buffers from the sim engine; the baseline is its single direct path without chunking."""

    label = "sim single-path"

    def __init__(self, eng: TransferEngine):
        self.eng = eng

    def device(self, n: int) -> Any:
        return self.eng.alloc_device(0, n)

    def pinned(self, n: int) -> Any:
        return self.eng.alloc_host(n).array()

    def native(self, dst: Any, src: Any, n: int, h2d: bool) -> None:
        self.eng.copy(dst, src, n, pageable="register", paths="direct", sync=True)

    def clock(self) -> float:
        return self.eng.now()


def side_for(eng: TransferEngine) -> _CudaSide | _SimSide:
    return _CudaSide(eng) if eng.backend == "cuda" else _SimSide(eng)


def _time(side: Any, fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(seconds on the side's clock, process CPU seconds, fn's result)."""
    c0, t0 = time.process_time(), side.clock()
    out = fn()
    t1, c1 = side.clock(), time.process_time()
    return t1 - t0, c1 - c0, out


def _fresh(n: int, touch: bool = True) -> np.ndarray:
    """A new pageable buffer: a source gets its data written (pages faulted in) before timing; a
    one-shot destination is left untouched, as a freshly allocated output buffer is."""
    a = np.empty(n, dtype=np.uint8)
    if touch:
        a.fill(3)
    return a


def _measure(side: Any, n: int, reps: int, native: Callable[[], Any], engine: Callable[[], Any],
             setup: Callable[[], None] | None = None) -> tuple[list[tuple[float, float]], list[tuple[float, float]], str]:
    nat, eng, mode = [], [], "?"
    for _ in range(reps):  # interleaved, so drift hits both alike
        if setup:
            setup()
        dt, cpu, _ = _time(side, native)
        nat.append((dt, cpu))
        if setup:
            setup()
        dt, cpu, info = _time(side, engine)
        eng.append((dt, cpu))
        mode = info.host_mode
    return nat, eng, mode


def _gbps(n: int, samples: list[tuple[float, float]]) -> tuple[float, float]:
    dt = statistics.median(s[0] for s in samples)
    cpu = statistics.median(s[1] for s in samples)
    return n / dt / 1e9, cpu / (n / 1e9)


def run_bench(eng: TransferEngine, sizes: tuple[int, ...] | None = None,
              directions: tuple[str, ...] = ("h2d", "d2h"), memories: tuple[str, ...] = MEMORY,
              progress: Callable[[str], None] | None = None) -> Iterator[BenchRow]:
    """Yield one row per (direction, memory, size)."""
    side = side_for(eng)
    sizes = sizes or (CUDA_SIZES if eng.backend == "cuda" else SIM_SIZES)
    for n in sizes:
        dev = side.device(n)
        pinned = side.pinned(n)
        reused = _fresh(n)
        for direction in directions:
            h2d = direction == "h2d"
            pinned_native = None
            reps = reps_for(n)
            for memory in memories:
                if progress:
                    progress(f"{direction} {memory} {n} B")
                holder: dict[str, np.ndarray] = {}
                if memory == "pinned":
                    host = lambda: pinned  # noqa: E731
                    setup = None
                elif memory == "pageable reused":
                    host = lambda: reused  # noqa: E731
                    eng.copy(dev, reused).wait() if h2d else eng.copy(reused, dev).wait()  # first sight
                    setup = None
                else:
                    def setup() -> None:
                        holder["a"] = None  # drop the old one first: its memory may be reused
                        holder["a"] = _fresh(n, touch=h2d)
                    host = lambda: holder["a"]  # noqa: E731

                def native() -> None:
                    side.native(dev, host(), n, True) if h2d else side.native(host(), dev, n, False)

                def engine() -> Any:  # synchronous, like the native baseline (copy + synchronize)
                    return (eng.copy(dev, host(), sync=True) if h2d else eng.copy(host(), dev, sync=True)).wait()

                nat, en, mode = _measure(side, n, reps, native, engine, setup)
                ng, ncpu = _gbps(n, nat)
                eg, ecpu = _gbps(n, en)
                if memory == "pinned":
                    pinned_native = ng
                yield BenchRow(direction, memory, n, eg, ng, eg / ng, eg / (pinned_native or ng), ecpu, ncpu, mode, reps)
        del dev, pinned, reused


def relay_figure(profile: str = "8xh20", target: int = 0, nbytes: int = 1 * GiB, reps: int = 3) -> RelayFigure:
    """sim: multipath copies into GPU `target` over its link and every relay, vs the model's aggregate
    (direct link + per relay min(relay GPU's link, peer bandwidth))."""
    from gpudash.engine.config import EngineConfig
    from gpudash.engine.profiles import get_profile

    rig = get_profile(profile)
    with TransferEngine(EngineConfig(backend="sim", profile=profile, h2d_fallback_bytes=0)) as eng:
        src = eng.alloc_host(nbytes)
        dev = eng.alloc_device(target, nbytes)
        rates = []
        for _ in range(reps):
            t0 = eng.now()
            eng.copy(dev, src).wait()
            rates.append(nbytes / (eng.now() - t0) / 1e9)
        relays = [v for v in range(len(rig.gpus)) if v != target and rig.peer_gbps(v, target)]
    model = rig.gpus[target].link_gbps + sum(min(rig.gpus[v].link_gbps, rig.peer_gbps(v, target) or 0) for v in relays)
    return RelayFigure(profile, target, len(relays), statistics.median(rates), model)


def check_engine(eng: TransferEngine) -> None:
    """Raise EngineError early when the bench cannot run here (no CuPy for the cuda baseline)."""
    if eng.backend == "cuda":
        try:
            import cupy  # noqa: F401
        except ImportError as err:
            raise EngineError(f"the cuda bench needs CuPy for its native baseline ({err}); "
                              f"install gpudash[cuda]") from None


def _size(n: int) -> str:
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n / 1e6:.2f} MB"


def bench_title(eng: TransferEngine) -> str:
    """What the bench ran on, for render() (read while the engine is open)."""
    return (f"SIM rig {eng.profile} (simulated seconds; not GPU numbers)" if eng.backend == "sim"
            else f"cuda: {eng.topology().gpus[0].name}")


def render(where: str, knobs: dict[str, Any], baseline: str, rows: list[BenchRow], fig: RelayFigure | None) -> str:
    """The side-by-side table; `where` is bench_title() (sim runs say SIM in it and in the relay line)."""
    head = (f"{'dir':<4} {'memory':<18} {'size':>9} {'engine GB/s':>12} {'native GB/s':>12} {'ratio':>7} "
            f"{'x pinned-nat':>12} {'eng core-s/GB':>13} {'nat core-s/GB':>13} {'engine path':<11} {'reps':>4}")
    lines = [f"gpudash bench engine: {where}", f"knobs: {knobs}",
             f"baseline: {baseline}; engine: copy(sync=True); medians; ratio = engine / native on the same buffers",
             head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.direction:<4} {r.memory:<18} {_size(r.size):>9} {r.engine_gbps:>12.2f} {r.native_gbps:>12.2f} "
                     f"{r.ratio:>6.2f}x {r.vs_pinned_native:>11.2f}x {r.engine_core_s_per_gb:>13.4f} "
                     f"{r.native_core_s_per_gb:>13.4f} {r.engine_path:<11} {r.reps:>4}")
    if fig is not None:
        lines.append(f"sim {fig.profile} (SIM): copies into GPU {fig.target} over its link + {fig.relays} relays: "
                     f"{fig.measured_gbps:.1f} GB/s of the {fig.model_gbps:.1f} GB/s the link model allows "
                     f"({fig.percent:.1f}%)")
    return "\n".join(lines)


def render_tune(res: Any) -> str:
    lines = [f"autotune result: {res.knobs}"]
    lines += [f"  {what:<24} {value:>12} {r:>9.2f}" for what, value, r in res.table]
    lines += [f"  note: {n}" for n in res.notes]
    return "\n".join(lines)
