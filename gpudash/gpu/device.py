"""One GPU as NVML sees it: the facts read once (StaticInfo), a sweep of the per-tick fields as a
GpuSample, its processes, its PCIe counters, NVLink and P2P. Every read goes through gpu/nvml.py's `call`
or `versioned`, so a field a GPU does not support is NA (None in the records), never an exception.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pynvml

from gpudash.gpu import nvml
from gpudash.gpu.nvml import NA, none, text
from gpudash.records import GpuProcessSample, GpuSample


# Per-process SM utilisation costs ~2.5 ms of CPU per read on an H200 (the driver asks the GPU's firmware;
# benchmarks/bench_nvml_calls.py), ten times the rest of a tick's NVML reads together: read it this often.
PROCESS_SM_EVERY_S = 2.0

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
# NVML's clock-event (throttle) reasons: (bit, the `reason` label of gpudash_gpu_clock_event_active, the TUI's
# words or None where it leaves the reason out: idle is no problem, nor is a display clock on an inference box).
CLOCK_EVENT_REASONS = (
    (pynvml.nvmlClocksEventReasonGpuIdle, "gpu_idle", None),
    (pynvml.nvmlClocksEventReasonApplicationsClocksSetting, "applications_clocks_setting", "app clocks"),
    (pynvml.nvmlClocksEventReasonSwPowerCap, "sw_power_cap", "power cap"),
    (pynvml.nvmlClocksEventReasonHwSlowdown, "hw_slowdown", "hw slowdown"),
    (pynvml.nvmlClocksEventReasonSyncBoost, "sync_boost", "sync boost"),
    (pynvml.nvmlClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown", "sw thermal"),
    (pynvml.nvmlClocksEventReasonHwThermalSlowdown, "hw_thermal_slowdown", "hw thermal"),
    (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown", "power brake"),
    (pynvml.nvmlClocksEventReasonDisplayClockSetting, "display_clock_setting", None),
)
CLOCK_EVENT_BIT = {name: bit for bit, name, _ in CLOCK_EVENT_REASONS}
_PCIE_FIELDS = [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
_NOT_AVAILABLE = 2**64 - 1
# nvidia-smi topo -p2p r; pynvml defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,) (stray comma).
_P2P_READ = 0


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
        reason = nvml.init()
        if reason is not None:
            raise RuntimeError(f"NVML unavailable: {reason}")
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._sm_since = 0  # NVML timestamp (us) of the last per-process utilisation sample read
        self._sm_read_at = -PROCESS_SM_EVERY_S  # monotonic time of that read
        self._sm_last: dict[int, float] = {}

    @cached_property
    def static(self) -> StaticInfo:
        h = self.handle
        mem = nvml.memory_info(h)
        bar1 = nvml.call(pynvml.nvmlDeviceGetBAR1MemoryInfo, h)
        cc = nvml.call(pynvml.nvmlDeviceGetCudaComputeCapability, h)
        pci = nvml.call(pynvml.nvmlDeviceGetPciInfo, h)
        bus = "" if pci is NA else text(pci.busId)
        return StaticInfo(
            index=self.index,
            name=text(none(nvml.call(pynvml.nvmlDeviceGetName, h)) or "?"),
            uuid=text(none(nvml.call(pynvml.nvmlDeviceGetUUID, h)) or ""),
            memory_total=None if mem is NA else int(mem.total),
            bar1_total=None if bar1 is NA else int(bar1.bar1Total),
            link_gen_max=none(nvml.call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)),
            link_width_max=none(nvml.call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)),
            numa_node=self._numa_node(bus),
            compute_capability=None if cc is NA else (int(cc[0]), int(cc[1])),
            pci_bus_id=bus,
            card_gen=none(nvml.versioned("nvmlDeviceGetGpuMaxPcieLinkGeneration", h)),
            card_width=_sysfs_int(bus, "max_link_width"),
        )

    def _numa_node(self, bus: str) -> int | None:
        node = nvml.versioned("nvmlDeviceGetNumaNodeId", self.handle)
        if node is NA:
            node = _sysfs_int(bus, "numa_node")
        return None if node is None or node < 0 else int(node)

    def memory_free(self) -> int | None:
        mem = nvml.memory_info(self.handle)
        return None if mem is NA else int(mem.free)

    def sample(self, ts: float, tx_bps: float | None, rx_bps: float | None,
               wire_bytes: tuple[int, int] | None = None) -> GpuSample:
        """One GpuSample from a sweep of this GPU's per-tick fields; the PCIe rates and the (TX, RX) wire-byte
        totals come from the counter thread."""
        h, st = self.handle, self.static
        clock_events = nvml.call(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        util = nvml.call(pynvml.nvmlDeviceGetUtilizationRates, h)
        mem = nvml.memory_info(h)
        power = nvml.call(pynvml.nvmlDeviceGetPowerUsage, h)
        bar1 = nvml.call(pynvml.nvmlDeviceGetBAR1MemoryInfo, h)
        return GpuSample(
            ts=ts, index=self.index, uuid=st.uuid, name=st.name,
            util_pct=None if util is NA else float(util.gpu),
            mem_used=None if mem is NA else int(mem.used),
            mem_total=None if mem is NA else int(mem.total),
            power_w=None if power is NA else power / 1000.0,
            temp_c=none(nvml.call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)),
            sm_clock_mhz=none(nvml.call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)),
            pcie_tx_bps=tx_bps, pcie_rx_bps=rx_bps,
            link_gen=none(nvml.call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)),
            link_width=none(nvml.call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
            link_gen_max=st.link_gen_max, link_width_max=st.link_width_max,
            bar1_total=st.bar1_total,
            bar1_used=None if bar1 is NA else int(bar1.bar1Used),
            throttle=None if clock_events is NA else throttle_text(clock_events),
            ecc_uncorrected=none(nvml.call(pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      pynvml.NVML_VOLATILE_ECC)),
            remapped_rows=self._remapped_rows(),
            pcie_tx_wire_bytes=None if wire_bytes is None else wire_bytes[0],
            pcie_rx_wire_bytes=None if wire_bytes is None else wire_bytes[1],
            pcie_replay_errors=none(nvml.call(pynvml.nvmlDeviceGetPcieReplayCounter, h)),
            clock_events=none(clock_events),
            **self._energy(),
        )

    def _energy(self) -> dict[str, object]:
        """The driver's energy counter (mJ since it loaded; Volta and newer) as GpuSample's energy fields, or
        none where the GPU lacks it (telemetry/energy.py then integrates power)."""
        mj = nvml.call(pynvml.nvmlDeviceGetTotalEnergyConsumption, self.handle)
        return {} if mj is NA else {"energy_j": mj / 1000.0, "energy_source": "counter"}

    def _remapped_rows(self) -> int | None:
        rows = nvml.call(pynvml.nvmlDeviceGetRemappedRows, self.handle)  # (correctable, uncorrectable, pending, failed)
        return None if rows is NA else int(rows[0]) + int(rows[1])

    def processes(self, ts: float, servers: dict[int, str]) -> list[GpuProcessSample]:
        """GPU memory per process (compute and graphics), tagged with the server gpudash launched."""
        seen: dict[int, int | None] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            procs = nvml.versioned(fn, self.handle)
            for p in () if procs is NA else procs:
                used = p.usedGpuMemory
                seen[p.pid] = None if used is None or used == _NOT_AVAILABLE else int(used)
        sm = self._process_sm()
        # a process the GPU's samples leave out ran no kernel in the window: 0 where any was sampled (what
        # splits a shared GPU's energy, telemetry/server_energy.py), unknown where none was
        return [GpuProcessSample(ts=ts, gpu_index=self.index, pid=pid, used_bytes=used,
                                 name=_process_name(pid), server=servers.get(pid),
                                 sm_pct=sm.get(pid, 0.0 if sm else None))
                for pid, used in sorted(seen.items())]

    def _process_sm(self) -> dict[int, float]:
        """SM utilisation % per process, the mean of NVML's samples since the previous read, read at most
        every PROCESS_SM_EVERY_S ({} where the GPU does not report it)."""
        now = time.monotonic()
        if now - self._sm_read_at < PROCESS_SM_EVERY_S:
            return self._sm_last
        self._sm_read_at = now
        samples = nvml.call(pynvml.nvmlDeviceGetProcessUtilization, self.handle, self._sm_since)
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
        values = nvml.call(pynvml.nvmlDeviceGetFieldValues, self.handle, _PCIE_FIELDS)
        if values is NA:
            return None
        tx, rx = nvml.field_int(values[0]), nvml.field_int(values[1])
        return None if tx is None or rx is None else (tx, rx)

    def pcie_throughput(self) -> tuple[float, float] | None:
        """(TX, RX) bytes/s from nvmlDeviceGetPcieThroughput (KB/s, sampled over ~20 ms; blocks)."""
        tx = nvml.call(pynvml.nvmlDeviceGetPcieThroughput, self.handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = nvml.call(pynvml.nvmlDeviceGetPcieThroughput, self.handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        if tx is NA or rx is NA:
            return None
        return tx * 1024.0, rx * 1024.0

    def nvlink_active_links(self) -> int | None:
        """Active NVLink links, or None when the GPU has no NVLink."""
        active, any_supported = 0, False
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = nvml.call(pynvml.nvmlDeviceGetNvLinkState, self.handle, link)
            if state is NA:
                continue
            any_supported = True
            active += int(state == pynvml.NVML_FEATURE_ENABLED)
        return active if any_supported else None


def throttle_text(mask: int) -> str:
    """The clock-event reasons of `mask` that hold clocks down, in the TUI's words ("none" when clocks run free)."""
    return ",".join(words for bit, _, words in CLOCK_EVENT_REASONS if words and mask & bit) or "none"


def _sysfs_int(bus: str, name: str) -> int | None:
    """An integer attribute of the GPU's PCI function in sysfs (numa_node, max_link_width); None if unreadable."""
    if not bus:
        return None
    # NVML's bus id has an 8-digit domain; sysfs uses 4 digits, lower case.
    try:
        return int((Path("/sys/bus/pci/devices") / bus.lower()[-12:] / name).read_text().strip())
    except (OSError, ValueError):
        return None


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def devices() -> list[Device]:
    return [Device(i) for i in range(nvml.device_count())]


def p2p_matrix(devs: list[Device]) -> tuple[tuple[str, ...], ...]:
    """P2P read status between every pair, coded like `nvidia-smi topo -p2p r` (X on the diagonal)."""
    rows = []
    for a in devs:
        row = []
        for b in devs:
            if a.index == b.index:
                row.append("X")
                continue
            status = nvml.call(pynvml.nvmlDeviceGetP2PStatus, a.handle, b.handle, _P2P_READ)
            row.append("U" if status is NA else P2P_CODES.get(status, "U"))
        rows.append(tuple(row))
    return tuple(rows)
