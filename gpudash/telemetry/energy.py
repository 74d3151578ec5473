"""GPU energy as one counter per GPU: the driver's where it has one, power integrated over time where not.

NVML's total energy counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ since the driver loaded, Volta and
newer) is exact between any two reads; gpu/device.py puts it on each GpuSample as `energy_j` with
`energy_source = "counter"`. A GPU without it (older, or a board that does not report it) gets its board
power integrated here instead (trapezoids between ticks, `energy_source = "integrated"`), which misses what
happens between two reads: `integrated` says so wherever the figure shows. Either counter only grows; its
change over a window is the energy spent in it, its value means nothing on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpudash.records import GpuSample

COUNTER, INTEGRATED, SIM = "counter", "integrated", "sim"


def trapezoid_j(t0: float, p0: float, t1: float, p1: float) -> float:
    """Joules between two power readings (watts at Unix seconds t0 < t1), the mean of both over the gap."""
    return max(0.0, t1 - t0) * (p0 + p1) / 2.0


class EnergyFill:
    """Gives every GpuSample an energy counter: the driver's is passed through, and a GPU without one gets
    its power integrated since the first sample this object saw (0 J there). One per source, fed its ticks
    in order."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float, float]] = {}  # GPU index -> (ts, power W, joules so far)

    def fill(self, gpus: Sequence[GpuSample]) -> tuple[GpuSample, ...]:
        return tuple(self._one(g) for g in gpus)

    def _one(self, g: GpuSample) -> GpuSample:
        if g.energy_j is not None:
            self._last.pop(g.index, None)
            return g
        if g.power_w is None:  # no power this tick: the counter holds, and integration resumes at the next one
            last = self._last.get(g.index)
            return g if last is None else replace(g, energy_j=last[2], energy_source=INTEGRATED)
        last = self._last.get(g.index)
        joules = 0.0 if last is None else last[2] + trapezoid_j(last[0], last[1], g.ts, g.power_w)
        self._last[g.index] = (g.ts, g.power_w, joules)
        return replace(g, energy_j=joules, energy_source=INTEGRATED)


def integrated_j(samples: Sequence[tuple[float, float]]) -> float:
    """Joules of (ts, watts) readings in time order, by trapezoids: what a power reader alone can tell."""
    return sum(trapezoid_j(t0, p0, t1, p1) for (t0, p0), (t1, p1) in zip(samples, samples[1:]))
