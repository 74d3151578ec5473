"""nvml.py without a GPU: the NA sentinel, and a clear refusal when there is no driver."""

from __future__ import annotations

import pynvml
import pytest

from gpudash.gpu import device, nvml
from gpudash.telemetry.nvml import NvmlSource
from gpudash.telemetry.rig import read_topology


def test_unsupported_fields_become_na_then_none() -> None:
    def unsupported() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    value = nvml.call(unsupported)
    assert value is nvml.NA and not value and repr(value) == "N/A"
    assert nvml.none(value) is None and nvml.none(0) == 0
    assert nvml.call(lambda x: x + 1, 1) == 2
    with pytest.raises(ZeroDivisionError):  # bugs are not swallowed, only NVML's answers
        nvml.call(lambda: 1 / 0)


def test_no_driver_is_reported_not_raised() -> None:
    reason = nvml.driver_available()
    if reason is None:
        assert nvml.device_count() >= 1  # a GPU machine: the gpu-marked tests cover the rest
        return
    assert isinstance(reason, str) and reason
    assert nvml.device_count() == 0
    with pytest.raises(RuntimeError, match="NVML unavailable"):
        NvmlSource()
    with pytest.raises(RuntimeError, match="cannot read the GPU topology"):
        read_topology("nvml")


def test_process_sm_is_read_every_few_seconds_as_a_mean_of_the_samples(monkeypatch) -> None:
    """nvmlDeviceGetProcessUtilization costs ~2.5 ms of CPU on an H200: one read per PROCESS_SM_EVERY_S,
    averaging each process's samples since the previous read, and the last values in between."""
    from types import SimpleNamespace as Sample

    reads: list[int] = []
    answers = [[Sample(pid=7, timeStamp=10, smUtil=20), Sample(pid=7, timeStamp=20, smUtil=40),
                Sample(pid=9, timeStamp=15, smUtil=5)],
               [Sample(pid=9, timeStamp=30, smUtil=50)]]

    def utilization(handle, since):
        reads.append(since)
        return answers[len(reads) - 1]

    clock = [100.0]
    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", utilization)
    monkeypatch.setattr(device.time, "monotonic", lambda: clock[0])
    dev = device.Device.__new__(device.Device)  # no GPU here: only the handle-free reader is exercised
    dev.handle, dev._sm_since, dev._sm_read_at, dev._sm_last = None, 0, -device.PROCESS_SM_EVERY_S, {}
    assert dev._process_sm() == {7: 30.0, 9: 5.0}
    clock[0] += device.PROCESS_SM_EVERY_S / 2
    assert dev._process_sm() == {7: 30.0, 9: 5.0} and reads == [0]  # not read again yet
    clock[0] += device.PROCESS_SM_EVERY_S
    assert dev._process_sm() == {9: 50.0} and reads == [0, 20]  # only samples newer than the last seen
