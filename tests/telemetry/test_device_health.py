"""Device.sample's PCIe replay counter and clock-event reasons through the one NVML choke point, without a GPU:
pynvml's functions answer as a driver would (a value, or NVML_ERROR_NOT_SUPPORTED), and what a GPU cannot say
is None in the sample (its series left out), never 0."""

from __future__ import annotations

import pynvml
import pytest

from gpudash.gpu import device
from gpudash.gpu.device import CLOCK_EVENT_BIT, CLOCK_EVENT_REASONS, Device, StaticInfo, throttle_text


def _unsupported(*_args, **_kwargs):
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Device:
    """A Device whose every per-tick read but the two under test is unsupported."""
    for name in dir(pynvml):
        if name.startswith("nvmlDeviceGet"):
            monkeypatch.setattr(pynvml, name, _unsupported)
    dev = Device.__new__(Device)
    dev.index, dev.handle = 0, object()
    dev._sm_since, dev._sm_read_at, dev._sm_last = 0, 0.0, {}
    dev.__dict__["static"] = StaticInfo(0, "NVIDIA H200", "GPU-x", None, None, 5, 16, None, None, "")
    return dev


def test_replays_and_clock_events_are_read_and_named(gpu: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    mask = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieReplayCounter", lambda h: 12)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: mask)
    s = gpu.sample(1.0, 5.0, 6.0, wire_bytes=(2**40, 7))
    assert s.pcie_replay_errors == 12 and s.clock_events == mask
    assert s.throttle == "power cap,hw thermal"
    assert (s.pcie_tx_wire_bytes, s.pcie_rx_wire_bytes, s.pcie_tx_bps, s.pcie_rx_bps) == (2**40, 7, 5.0, 6.0)


def test_what_the_gpu_cannot_say_is_none(gpu: Device) -> None:
    s = gpu.sample(1.0, None, None)
    assert s.pcie_replay_errors is None and s.clock_events is None and s.throttle is None
    assert s.pcie_tx_wire_bytes is None and s.pcie_rx_wire_bytes is None


def test_the_reasons_are_nvmls_bits_with_the_agreed_names() -> None:
    assert [name for _, name, _ in CLOCK_EVENT_REASONS] == [
        "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
        "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"]
    bits = [bit for bit, _, _ in CLOCK_EVENT_REASONS]
    assert len(set(bits)) == len(bits) and all(bit & (bit - 1) == 0 for bit in bits)  # one bit each
    assert CLOCK_EVENT_BIT["gpu_idle"] == 1 and CLOCK_EVENT_BIT["display_clock_setting"] == 0x100
    assert throttle_text(CLOCK_EVENT_BIT["gpu_idle"]) == "none"  # idle is no throttle to the TUI
    assert throttle_text(0) == "none" and device.throttle_text(0x4) == "power cap"
