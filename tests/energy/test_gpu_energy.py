"""GPU energy counters: the sim rig's against its own power integrated, the fill that integrates power where a
GPU has no counter, the store's column and migration, and the exporter's counter beside dcgm-exporter."""

from __future__ import annotations

import time

import pytest

from gpudash.engine import EngineConfig, TransferEngine
from gpudash.records import GpuSample
from gpudash.telemetry.energy import EnergyFill, integrated_j
from gpudash.telemetry.sampler import Sampler
from gpudash.telemetry.sim import SimRigSource

MiB = 2**20


@pytest.fixture
def engine():
    eng = TransferEngine(EngineConfig(backend="sim", profile="rtx5080+rtx3090"))
    yield eng
    eng.close()


def test_the_sim_counter_matches_its_power_integrated(engine) -> None:
    """Polled at 10 Hz for 3 s while copies come and go, each sim GPU's counter grows by its power integrated
    (trapezoids over the readings) within 2%, and starts far from 0 (it counts since the 'driver' loaded)."""
    src = SimRigSource("rtx5080+rtx3090", engine)
    host, dev = engine.alloc_host(8 * MiB), engine.alloc_device(1, 8 * MiB)
    readings: list[tuple[GpuSample, ...]] = []
    try:
        end = time.monotonic() + 3.0
        n = 0
        while time.monotonic() < end:
            if n % 10 < 4:  # bursts of traffic to GPU 1, so its power moves
                engine.copy(dev, host).wait()
            readings.append(src.poll()["gpus"])
            n += 1
            time.sleep(0.1)
    finally:
        dev.free()
        host.free()
        src.close()
    for i in range(2):
        series = [r[i] for r in readings]
        assert {g.energy_source for g in series} == {"sim"}
        assert series[0].energy_j > 1000.0  # since an hour before, not since gpudash started
        counted = series[-1].energy_j - series[0].energy_j
        power = integrated_j([(g.ts, g.power_w) for g in series])
        assert counted == pytest.approx(power, rel=0.02), f"GPU {i}"
    assert len({g.power_w for g in (r[1] for r in readings)}) > 2  # the power did move


def _gpu(ts: float, power: float | None, energy: float | None = None, index: int = 0) -> GpuSample:
    return GpuSample(ts=ts, index=index, uuid=f"GPU-{index}", name="x", power_w=power, energy_j=energy,
                     energy_source="counter" if energy is not None else None)


def test_power_is_integrated_only_where_the_counter_is_missing() -> None:
    fill = EnergyFill()
    first = fill.fill([_gpu(100.0, 200.0), _gpu(100.0, 300.0, energy=5e6, index=1)])
    later = fill.fill([_gpu(102.0, 100.0), _gpu(102.0, 300.0, energy=5e6 + 600.0, index=1)])
    gap = fill.fill([_gpu(103.0, None), _gpu(103.0, None, energy=5e6 + 900.0, index=1)])
    after = fill.fill([_gpu(104.0, 100.0), _gpu(104.0, None, energy=5e6 + 1200.0, index=1)])
    assert [(g.energy_j, g.energy_source) for g in first] == [(0.0, "integrated"), (5e6, "counter")]
    assert [(g.energy_j, g.energy_source) for g in later] == [(300.0, "integrated"), (5e6 + 600.0, "counter")]
    assert gap[0].energy_j == 300.0  # no power read: the counter holds
    assert after[0].energy_j == 300.0 + 200.0  # 100 W over the 2 s since the last reading


def test_a_sampler_tick_carries_energy_for_every_sim_gpu(engine) -> None:
    src = SimRigSource("rtx5080+rtx3090", engine)
    s = Sampler([src], interval_s=1, source_label=src.label)
    try:
        a, b = s.poll_once(), s.poll_once()
    finally:
        s.stop()
    for g0, g1 in zip(a.gpus, b.gpus):
        assert g1.energy_j - g0.energy_j == pytest.approx(g1.power_w * (g1.ts - g0.ts), rel=1e-6)
