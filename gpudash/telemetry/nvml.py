"""NvmlSource: the telemetry source for real GPUs, one sweep of every GPU per tick (gpu/device.py) plus
their PCIe rates and driver faults.

PCIe rates come from the wrapping byte counters, unwrapped by a background poller (pcie_counters.py), whose
64-bit wire-byte totals each GpuSample carries too (the exposition's `_bytes_total` counters);
where a GPU lacks those fields, `nvmlDeviceGetPcieThroughput` (blocks ~20 ms) runs per GPU on its own
thread (ThroughputPoller) so it never sits on the tick's critical path. Xid and other fatal driver events
come from gpu/xid.py's event set, drained once per tick.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpudash.gpu.device import Device, devices
from gpudash.gpu.nvml import driver_available, in_flight
from gpudash.telemetry.energy import EnergyFill
from gpudash.telemetry.pcie_cache import cached_overhead
from gpudash.telemetry.pcie_counters import DEFAULT_WIRE_OVERHEAD, CounterPoller, CounterTotals, TickRates
from gpudash.gpu.xid import XidWatcher


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
        self._energy = EnergyFill()  # power integrated for the GPUs without an energy counter

    def _rates(self, totals: list[CounterTotals | None]) -> dict[int, tuple[float, float] | None]:
        out = dict(zip(self.counter_gpus, self._tick_rates.update(totals)))
        for d in self.devices:
            if d.index not in out:
                out[d.index] = self._throughput.latest(d.index)
        return out

    def poll(self) -> dict[str, tuple]:
        ts = time.time()
        totals = self.counters.totals()
        r = self._rates(totals)
        wire = {i: (t.tx, t.rx) for i, t in zip(self.counter_gpus, totals) if t is not None}
        servers = self._pids()
        gpus, procs = [], []
        for d in self.devices:
            tx_rx = r.get(d.index)
            gpus.append(d.sample(ts, *(tx_rx if tx_rx else (None, None)), wire_bytes=wire.get(d.index)))
            procs.extend(d.processes(ts, servers))
        out: dict[str, tuple] = {"gpus": self._energy.fill(gpus), "gpu_processes": tuple(procs)}
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
