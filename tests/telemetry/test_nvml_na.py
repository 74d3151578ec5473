"""nvml.py without a GPU: the NA sentinel, and a clear refusal when there is no driver."""

from __future__ import annotations

import pynvml
import pytest

from gpudash.telemetry import nvml
from gpudash.telemetry.topology import read_topology


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
        nvml.NvmlSource()
    with pytest.raises(RuntimeError, match="cannot read the GPU topology"):
        read_topology("nvml")
