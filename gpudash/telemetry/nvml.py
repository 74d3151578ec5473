"""The one choke point around NVML (nvidia-ml-py's `pynvml`), modelled on nvitop's libnvml.

NVML is initialised lazily on first use. A field a GPU does not support comes back as the `NA`
sentinel instead of an exception, and records carry None for it. Static facts (name, UUID, totals,
maximum link) are read once per device; `NvmlSource.poll` does one sweep per tick. PCIe rates come
from the wrapping byte counters, unwrapped by a background poller (see pcie_counters.py); where a GPU
lacks those fields, `nvmlDeviceGetPcieThroughput` (blocks ~20 ms) runs per GPU on its own thread so
it never sits on the tick's critical path. Xid and other fatal driver events come from xid.py's event
set, drained once per tick.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pynvml

from gpudash.records import GpuProcessSample, GpuSample
from gpudash.telemetry.pcie_cache import cached_overhead
from gpudash.telemetry.pcie_counters import DEFAULT_WIRE_OVERHEAD, CounterPoller, TickRates
from gpudash.telemetry.xid import XidWatcher


# Per-process SM utilisation costs ~2.5 ms of CPU per read on an H200 (the driver asks the GPU's firmware;
# benchmarks/bench_nvml_calls.py), ten times the rest of a tick's NVML reads together: read it this often.
PROCESS_SM_EVERY_S = 2.0


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

# nvidia-smi topo -p2p legend.
P2P_CODES = {
    pynvml.NVML_P2P_STATUS_OK: "OK",
    pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED: "CNS",
    pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED: "GNS",
    pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED: "TNS",
    pynvml.NVML_P2P_STATUS_DISABLED_BY_REGKEY: "NS",
    pynvml.NVML_P2P_STATUS_NOT_SUPPORTED: "NS",
    pynvml.NVML_P2P_STATUS_UNKNOWN: "U",
}
# Clock throttle reasons worth naming (idle is not a problem, so it is left out).
_THROTTLE_REASONS = (
    (pynvml.nvmlClocksThrottleReasonApplicationsClocksSetting, "app clocks"),
    (pynvml.nvmlClocksThrottleReasonSwPowerCap, "power cap"),
    (pynvml.nvmlClocksThrottleReasonHwSlowdown, "hw slowdown"),
    (pynvml.nvmlClocksThrottleReasonSyncBoost, "sync boost"),
    (pynvml.nvmlClocksThrottleReasonSwThermalSlowdown, "sw thermal"),
    (pynvml.nvmlClocksThrottleReasonHwThermalSlowdown, "hw thermal"),
    (pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown, "power brake"),
)
_PCIE_FIELDS = [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
_NOT_AVAILABLE = 2**64 - 1
# nvidia-smi topo -p2p r; pynvml defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,) (stray comma).
_P2P_READ = 0


def _init() -> str | None:
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
    reason = _init()
    if reason is None and device_count() == 0:
        return "NVML reports no GPUs"
    return reason


def driver_version() -> str | None:
    """The NVIDIA driver's version string, or None without NVML."""
    if _init() is not None:
        return None
    return _text(none(call(pynvml.nvmlSystemGetDriverVersion)) or "") or None


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports ("12.4"), or None without NVML."""
    if _init() is not None:
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
    if _init() is not None:
        return 0
    count = call(pynvml.nvmlDeviceGetCount)
    return 0 if count is NA else int(count)


_memory_v2 = True  # until the driver says it lacks nvmlDeviceGetMemoryInfo_v2


def _memory(handle: Any) -> Any:
    """Memory info, v2 where the driver has it (used excludes driver-reserved memory, as nvidia-smi shows)."""
    global _memory_v2
    if _memory_v2:
        mem = call(pynvml.nvmlDeviceGetMemoryInfo, handle, version=pynvml.nvmlMemory_v2)
        if mem is not NA:
            return mem
        _memory_v2 = False
    return call(pynvml.nvmlDeviceGetMemoryInfo, handle)


def _field_int(fv: Any) -> int | None:
    if fv.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    vt = fv.valueType
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(fv.value.uiVal)
    if vt == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return int(fv.value.dVal)
    return int(fv.value.ullVal)


@dataclass(frozen=True, slots=True)
class StaticInfo:
    """What does not change while gpudash runs."""

    index: int
    name: str
    uuid: str
    memory_total: int | None
    bar1_total: int | None
    link_gen_max: int | None
    link_width_max: int | None
    numa_node: int | None
    compute_capability: tuple[int, int] | None
    pci_bus_id: str
    card_gen: int | None = None  # the GPU's own max generation (link_gen_max also counts the slot)
    card_width: int | None = None  # the GPU's own lane count, from sysfs (NVML has no such query)


class Device:
    """One GPU by NVML index; every read goes through `call` so unsupported fields become NA."""

    def __init__(self, index: int) -> None:
        if _init() is not None:
            raise RuntimeError(f"NVML unavailable: {_init_error}")
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._sm_since = 0  # NVML timestamp (us) of the last per-process utilisation sample read
        self._sm_read_at = -PROCESS_SM_EVERY_S  # monotonic time of that read
        self._sm_last: dict[int, float] = {}

    @cached_property
    def static(self) -> StaticInfo:
        h = self.handle
        mem = _memory(h)
        bar1 = call(pynvml.nvmlDeviceGetBAR1MemoryInfo, h)
        cc = call(pynvml.nvmlDeviceGetCudaComputeCapability, h)
        pci = call(pynvml.nvmlDeviceGetPciInfo, h)
        bus = "" if pci is NA else _text(pci.busId)
        return StaticInfo(
            index=self.index,
            name=_text(none(call(pynvml.nvmlDeviceGetName, h)) or "?"),
            uuid=_text(none(call(pynvml.nvmlDeviceGetUUID, h)) or ""),
            memory_total=None if mem is NA else int(mem.total),
            bar1_total=None if bar1 is NA else int(bar1.bar1Total),
            link_gen_max=none(call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)),
            link_width_max=none(call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)),
            numa_node=self._numa_node(bus),
            compute_capability=None if cc is NA else (int(cc[0]), int(cc[1])),
            pci_bus_id=bus,
            card_gen=none(call(getattr(pynvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration", _unsupported), h)),
            card_width=_sysfs_int(bus, "max_link_width"),
        )

    def _numa_node(self, bus: str) -> int | None:
        node = call(getattr(pynvml, "nvmlDeviceGetNumaNodeId", _unsupported), self.handle)
        if node is NA:
            node = _sysfs_int(bus, "numa_node")
        return None if node is None or node < 0 else int(node)

    def memory_free(self) -> int | None:
        mem = _memory(self.handle)
        return None if mem is NA else int(mem.free)

    def sample(self, ts: float, tx_bps: float | None, rx_bps: float | None) -> GpuSample:
        """One GpuSample from a sweep of this GPU's per-tick fields."""
        h, st = self.handle, self.static
        util = call(pynvml.nvmlDeviceGetUtilizationRates, h)
        mem = _memory(h)
        power = call(pynvml.nvmlDeviceGetPowerUsage, h)
        bar1 = call(pynvml.nvmlDeviceGetBAR1MemoryInfo, h)
        return GpuSample(
            ts=ts, index=self.index, uuid=st.uuid, name=st.name,
            util_pct=None if util is NA else float(util.gpu),
            mem_used=None if mem is NA else int(mem.used),
            mem_total=None if mem is NA else int(mem.total),
            power_w=None if power is NA else power / 1000.0,
            temp_c=none(call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)),
            sm_clock_mhz=none(call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)),
            pcie_tx_bps=tx_bps, pcie_rx_bps=rx_bps,
            link_gen=none(call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)),
            link_width=none(call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
            link_gen_max=st.link_gen_max, link_width_max=st.link_width_max,
            bar1_total=st.bar1_total,
            bar1_used=None if bar1 is NA else int(bar1.bar1Used),
            throttle=self._throttle(),
            ecc_uncorrected=none(call(pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      pynvml.NVML_VOLATILE_ECC)),
            remapped_rows=self._remapped_rows(),
        )

    def _throttle(self) -> str | None:
        """The active clock event reasons by name ("none" when clocks run free), None if not reported."""
        mask = call(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, self.handle)
        if mask is NA:
            return None
        names = [name for bit, name in _THROTTLE_REASONS if mask & bit]
        return ",".join(names) or "none"

    def _remapped_rows(self) -> int | None:
        rows = call(pynvml.nvmlDeviceGetRemappedRows, self.handle)  # (correctable, uncorrectable, pending, failed)
        return None if rows is NA else int(rows[0]) + int(rows[1])

    def processes(self, ts: float, servers: dict[int, str]) -> list[GpuProcessSample]:
        """GPU memory per process (compute and graphics), tagged with the server gpudash launched."""
        seen: dict[int, int | None] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            procs = versioned(fn, self.handle)
            for p in () if procs is NA else procs:
                used = p.usedGpuMemory
                seen[p.pid] = None if used is None or used == _NOT_AVAILABLE else int(used)
        sm = self._process_sm()
        return [GpuProcessSample(ts=ts, gpu_index=self.index, pid=pid, used_bytes=used,
                                 name=_process_name(pid), server=servers.get(pid), sm_pct=sm.get(pid))
                for pid, used in sorted(seen.items())]

    def _process_sm(self) -> dict[int, float]:
        """SM utilisation % per process, the mean of NVML's samples since the previous read, read at most
        every PROCESS_SM_EVERY_S ({} where the GPU does not report it)."""
        now = time.monotonic()
        if now - self._sm_read_at < PROCESS_SM_EVERY_S:
            return self._sm_last
        self._sm_read_at = now
        samples = call(pynvml.nvmlDeviceGetProcessUtilization, self.handle, self._sm_since)
        if samples is NA:
            self._sm_last = {}
            return {}
        self._sm_since = max([self._sm_since, *(int(x.timeStamp) for x in samples)])
        per_pid: dict[int, list[float]] = {}
        for x in samples:
            per_pid.setdefault(int(x.pid), []).append(float(x.smUtil))
        self._sm_last = {pid: sum(v) / len(v) for pid, v in per_pid.items()}
        return self._sm_last

    def pcie_counters(self) -> tuple[int, int] | None:
        """Raw (TX, RX) PCIe byte counters, or None when this GPU does not have them."""
        values = call(pynvml.nvmlDeviceGetFieldValues, self.handle, _PCIE_FIELDS)
        if values is NA:
            return None
        tx, rx = _field_int(values[0]), _field_int(values[1])
        return None if tx is None or rx is None else (tx, rx)

    def pcie_throughput(self) -> tuple[float, float] | None:
        """(TX, RX) bytes/s from nvmlDeviceGetPcieThroughput (KB/s, sampled over ~20 ms; blocks)."""
        tx = call(pynvml.nvmlDeviceGetPcieThroughput, self.handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = call(pynvml.nvmlDeviceGetPcieThroughput, self.handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        if tx is NA or rx is NA:
            return None
        return tx * 1024.0, rx * 1024.0

    def nvlink_active_links(self) -> int | None:
        """Active NVLink links, or None when the GPU has no NVLink."""
        active, any_supported = 0, False
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = call(pynvml.nvmlDeviceGetNvLinkState, self.handle, link)
            if state is NA:
                continue
            any_supported = True
            active += int(state == pynvml.NVML_FEATURE_ENABLED)
        return active if any_supported else None


def _unsupported(*_: Any) -> Any:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def _sysfs_int(bus: str, name: str) -> int | None:
    """An integer attribute of the GPU's PCI function in sysfs (numa_node, max_link_width); None if unreadable."""
    if not bus:
        return None
    # NVML's bus id has an 8-digit domain; sysfs uses 4 digits, lower case.
    try:
        return int((Path("/sys/bus/pci/devices") / bus.lower()[-12:] / name).read_text().strip())
    except (OSError, ValueError):
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def devices() -> list[Device]:
    return [Device(i) for i in range(device_count())]


def p2p_matrix(devs: list[Device]) -> tuple[tuple[str, ...], ...]:
    """P2P read status between every pair, coded like `nvidia-smi topo -p2p r` (X on the diagonal)."""
    rows = []
    for a in devs:
        row = []
        for b in devs:
            if a.index == b.index:
                row.append("X")
                continue
            status = call(pynvml.nvmlDeviceGetP2PStatus, a.handle, b.handle, _P2P_READ)
            row.append("U" if status is NA else P2P_CODES.get(status, "U"))
        rows.append(tuple(row))
    return tuple(rows)


class ThroughputPoller:
    """Fallback for GPUs without PCIe counter fields: one thread per GPU keeps the latest throughput."""

    def __init__(self, devs: list[Device], period_s: float = 1.0) -> None:
        self.period_s = period_s
        self._latest: dict[int, tuple[float, float] | None] = {d.index: None for d in devs}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(d,), daemon=True,
                                          name=f"gpudash-pcie-throughput-{d.index}") for d in devs]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def latest(self, index: int) -> tuple[float, float] | None:
        return self._latest.get(index)

    def _run(self, dev: Device) -> None:
        while not self._stop.is_set():
            self._latest[dev.index] = dev.pcie_throughput()
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=1)


class NvmlSource:
    """Telemetry source for real GPUs: yields `gpus` and `gpu_processes` each tick.

    PCIe rates are payload bytes/s: counter bytes divided by each GPU's wire overhead (wire bytes per
    payload byte) as cached by `pcie_calibration`, else DEFAULT_WIRE_OVERHEAD, said once in errors.
    The counters are read every `counter_max_interval_s` while idle (each read costs ~0.7 ms of CPU on an
    H200): at 0.5 s a burst from idle to over 8.6 GB/s is under-counted during its first half second
    only (pcie_counters.py), which keeps an idle box's counter reads at two a second.
    """

    name = "nvml"

    def __init__(self, pids: Callable[[], dict[int, str]] | None = None,
                 wire_overhead: dict[int, float] | None = None, counter_max_interval_s: float = 0.5) -> None:
        reason = driver_available()
        if reason is not None:
            raise RuntimeError(f"NVML unavailable: {reason}")
        self._pids = pids or dict
        self.devices = devices()
        given = wire_overhead or {}
        self.wire_overhead = {d.index: given.get(d.index) or cached_overhead(d.static.uuid) for d in self.devices}
        counted = [d for d in self.devices if d.pcie_counters() is not None]
        self.counter_gpus = [d.index for d in counted]
        self.counters = CounterPoller([d.pcie_counters for d in counted], max_interval_s=counter_max_interval_s)
        self.counters.start()
        self._throughput = ThroughputPoller([d for d in self.devices if d.index not in self.counter_gpus])
        self._throughput.start()
        self._tick_rates = TickRates([1.0 / (self.wire_overhead[i] or DEFAULT_WIRE_OVERHEAD)
                                      for i in self.counter_gpus])
        uncalibrated = [i for i in self.counter_gpus if self.wire_overhead[i] is None]
        self._notes: tuple[str, ...] = () if not uncalibrated else (
            f"nvml: PCIe counters of GPU {', '.join(map(str, uncalibrated))} uncalibrated; assuming "
            f"{DEFAULT_WIRE_OVERHEAD} wire bytes per payload byte (run python -m gpudash.telemetry.pcie_calibration)",)
        self.xids = XidWatcher({d.index: d.handle for d in self.devices}, guard=in_flight)

    def _rates(self) -> dict[int, tuple[float, float] | None]:
        out = dict(zip(self.counter_gpus, self._tick_rates.update(self.counters.totals())))
        for d in self.devices:
            if d.index not in out:
                out[d.index] = self._throughput.latest(d.index)
        return out

    def poll(self) -> dict[str, tuple]:
        ts = time.time()
        r = self._rates()
        servers = self._pids()
        gpus, procs = [], []
        for d in self.devices:
            tx_rx = r.get(d.index)
            gpus.append(d.sample(ts, *(tx_rx if tx_rx else (None, None))))
            procs.extend(d.processes(ts, servers))
        out: dict[str, tuple] = {"gpus": tuple(gpus), "gpu_processes": tuple(procs)}
        faults = self.xids.poll(ts)
        if faults:
            out["events"] = faults
        notes, self._notes = self._notes + self.xids.take_notes(), ()
        if notes:
            out["errors"] = notes
        return out

    def close(self) -> None:
        self.counters.stop()
        self._throughput.stop()
        self.xids.close()
