"""On the GPU machine (not run without one: `pytest tests/energy/test_energy_gpu.py -m gpu -s`): the driver's
energy counter, read through gpudash's NVML choke point, against board power integrated at 10 Hz over a
60 s CuPy load, within 2%; and every GPU of the box has the counter (Volta and newer) or says it integrates."""

from __future__ import annotations

import threading
import time

import pytest

from gpudash.gpu import nvml
from gpudash.gpu.device import Device, devices
from gpudash.telemetry.energy import integrated_j

pytestmark = pytest.mark.gpu
LOAD_S, HZ = 60.0, 10.0


def _load(stop: threading.Event) -> None:
    """Matrix products on GPU 0 until `stop`, with pauses, so the power moves between idle and busy."""
    import cupy as cp

    with cp.cuda.Device(0):
        a = cp.random.random((8192, 8192), dtype=cp.float32)
        while not stop.is_set():
            for _ in range(20):
                a = a @ a
                a /= cp.linalg.norm(a)
            cp.cuda.Stream.null.synchronize()
            stop.wait(0.5)


def test_the_energy_counter_matches_power_integrated_at_10_hz() -> None:
    assert nvml.driver_available() is None
    dev = Device(0)
    stop = threading.Event()
    worker = threading.Thread(target=_load, args=(stop,), daemon=True)
    readings = []
    worker.start()
    try:
        end = time.monotonic() + LOAD_S
        while time.monotonic() < end:
            g = dev.sample(time.time(), None, None)
            readings.append(g)
            time.sleep(1.0 / HZ)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert {g.energy_source for g in readings} == {"counter"}, "GPU 0 has no energy counter (pre-Volta?)"
    counted = readings[-1].energy_j - readings[0].energy_j
    power = integrated_j([(g.ts, g.power_w) for g in readings])
    print(f"\n{readings[0].name}: counter {counted:.1f} J, power at {HZ:g} Hz integrated {power:.1f} J over "
          f"{readings[-1].ts - readings[0].ts:.1f} s ({(counted - power) / power:+.2%})")
    assert counted == pytest.approx(power, rel=0.02)


def test_every_gpu_says_how_its_energy_is_had() -> None:
    from gpudash.telemetry.nvml import NvmlSource

    src = NvmlSource()
    try:
        first = src.poll()["gpus"]
        time.sleep(1.0)
        second = src.poll()["gpus"]
    finally:
        src.close()
    assert len(first) == len(devices()) >= 1
    for a, b in zip(first, second):
        assert a.energy_source in ("counter", "integrated"), a
        assert b.energy_j >= a.energy_j
