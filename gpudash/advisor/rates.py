"""Per-GPU throughput the planner and the overlap baseline use: measured with CuPy on real GPUs, taken
from gpudash/engine/profiles.py on sim rigs (and labelled so; a sim number is never shown as a GPU number)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpudash.engine.profiles import get_profile, pcie_payload_gbps
from gpudash.advisor.planner import GpuBudget
from gpudash.records import GpuSample
from gpudash.telemetry.topology import GpuFacts, TopologyFacts

SIM_SOURCE = "sim profile"
MEASURED_SOURCE = "measured (CuPy fp16)"


@dataclass(frozen=True, slots=True)
class GpuRates:
    """What one GPU does per second: device memory bandwidth (GB/s) and dense matmul rate (TFLOPS)."""

    mem_bw_gbps: float
    matmul_tflops: float
    source: str


class RatesUnavailable(RuntimeError):
    """Throughput cannot be measured here (no CuPy); the message says how to get it."""


def sim_rates(topology: TopologyFacts) -> dict[int, GpuRates]:
    """The sim rig's profile numbers for each of its GPUs."""
    rig = get_profile(topology.profile or "")
    return {g.index: GpuRates(rig.gpus[g.index].mem_bw_gbps, rig.gpus[g.index].bf16_tflops, SIM_SOURCE)
            for g in topology.gpus}


def measured_rates(topology: TopologyFacts) -> dict[int, GpuRates]:
    """Memory bandwidth and matmul rate of every GPU, measured now with CuPy."""
    from gpudash.advisor import measure

    try:
        measure.cupy()
    except ImportError as err:
        raise RatesUnavailable(f"CuPy is not installed ({err}); install it (pip install 'gpudash[cuda]') to "
                               "measure throughput") from None
    try:
        return {g.index: GpuRates(measure.memory_bandwidth_gbps(g.index), measure.matmul_tflops(g.index),
                                  MEASURED_SOURCE) for g in topology.gpus}
    except Exception as err:  # CuPy's CUDA/cuBLAS/allocation errors have no common base class
        raise RatesUnavailable(f"measuring GPU throughput with CuPy failed ({type(err).__name__}: {err}); "
                               "check that CuPy matches the installed CUDA driver") from None


def rates_for(topology: TopologyFacts) -> dict[int, GpuRates]:
    """Profile numbers on a sim rig, CuPy measurements on real GPUs."""
    return sim_rates(topology) if topology.is_sim else measured_rates(topology)


def host_link_gbps(g: GpuFacts) -> float | None:
    """Payload GB/s of a GPU's host link at the generation/width it trains at now (max when unknown)."""
    gen, width = g.link_gen or g.link_gen_max, g.link_width or g.link_width_max
    return pcie_payload_gbps(gen, width) if gen and width else None


def budgets(topology: TopologyFacts, rates: dict[int, GpuRates] | None = None) -> list[GpuBudget]:
    """Planner inputs: free memory per GPU plus its rates when known."""
    out = []
    for g in topology.gpus:
        free = g.memory_free if g.memory_free is not None else g.memory_total
        if free is None:
            raise RatesUnavailable(f"GPU {g.index} reports neither free nor total memory; the split cannot be planned")
        r = (rates or {}).get(g.index)
        out.append(GpuBudget(g.index, g.name, free, r.mem_bw_gbps if r else None, r.matmul_tflops if r else None,
                             r.source if r else ""))
    return out


def budgets_from_samples(gpus: Sequence[GpuSample], rates: dict[int, GpuRates] | None = None,
                         held: dict[int, int] | None = None) -> list[GpuBudget]:
    """Planner inputs from one tick's GPU samples (what the TUI has, live or replayed): free memory is
    total minus used, plus `held` bytes per GPU that the server being re-split would release."""
    out = []
    for g in gpus:
        if g.mem_total is None or g.mem_used is None:
            raise RatesUnavailable(f"GPU {g.index} has no memory reading this tick; the split cannot be planned")
        r = (rates or {}).get(g.index)
        free = g.mem_total - g.mem_used + (held or {}).get(g.index, 0)
        out.append(GpuBudget(g.index, g.name, free, r.mem_bw_gbps if r else None, r.matmul_tflops if r else None,
                             r.source if r else ""))
    return out
