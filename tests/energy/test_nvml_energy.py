"""The NVML side without a GPU: pynvml's answers stood in for (as tests/telemetry/test_nvml_na.py does), read
through gpu/device.py's Device as on a real box: the energy counter in mJ becomes joules marked "counter",
a GPU without it gets its power integrated by NvmlSource's fill, and a process the GPU's utilisation
samples leave out ran nothing (0% SM, which splits a shared GPU) where any process was sampled."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from gpudash.gpu import device, nvml
from gpudash.gpu.device import StaticInfo
from gpudash.telemetry.energy import EnergyFill


def _device(monkeypatch: pytest.MonkeyPatch) -> device.Device:
    monkeypatch.setattr(nvml, "_chosen", {})
    dev = device.Device.__new__(device.Device)  # no GPU here: the handle is never passed to a real driver
    dev.handle, dev.index = None, 0
    dev._sm_since, dev._sm_read_at, dev._sm_last = 0, -device.PROCESS_SM_EVERY_S, {}
    dev.__dict__["static"] = StaticInfo(0, "NVIDIA H100", "GPU-x", None, None, None, None, None, None, "")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: 250_000)  # mW
    return dev


def _unsupported(*args: object) -> None:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_the_drivers_counter_in_joules(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _device(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", lambda h: 123_456_789)  # mJ
    g = dev.sample(1000.0, None, None)
    assert (g.energy_j, g.energy_source, g.power_w) == (123_456.789, "counter", 250.0)


def test_a_gpu_without_the_counter_gets_its_power_integrated(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _device(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", _unsupported)
    fill = EnergyFill()
    a, b = (fill.fill([dev.sample(ts, None, None)])[0] for ts in (1000.0, 1002.0))
    assert (a.energy_j, b.energy_j, b.energy_source) == (0.0, 500.0, "integrated")


def test_an_unsampled_process_ran_nothing_where_others_were_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _device(monkeypatch)
    running = [SimpleNamespace(pid=7, usedGpuMemory=2**30), SimpleNamespace(pid=9, usedGpuMemory=2**30)]
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: running)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda h: [])
    samples = [[SimpleNamespace(pid=7, timeStamp=10, smUtil=60)], None]

    def utilization(handle: object, since: int) -> list:
        answer = samples.pop(0)
        if answer is None:  # NVML's answer when no process ran a kernel since `since`
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return answer

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", utilization)
    procs = dev.processes(1000.0, {7: "a", 9: "b"})
    assert [(p.pid, p.server, p.sm_pct) for p in procs] == [(7, "a", 60.0), (9, "b", 0.0)]
    dev._sm_read_at = -device.PROCESS_SM_EVERY_S  # the next read is due
    procs = dev.processes(1001.0, {7: "a", 9: "b"})
    assert [p.sm_pct for p in procs] == [None, None]  # none sampled: unknown, not 0
