"""The compute/communication baseline per GPU: T_compute, T_comm, whether deferring by one layer
hides the communication, the depth that would, and the memory-bandwidth utilisation with and without
overlap. On sim rigs every time is arithmetic over the profile (labelled sim); on real GPUs T_compute
and the links are measured with CuPy and the engine, and the overlap itself is run (compute on one
stream while the engine copies the next layer's weights) to report achieved against ideal time.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpudash.engine.profiles import get_profile
from gpudash.advisor.overlap import LayerShape, Overlap, analyse, comm_time_s, compute_time_s
from gpudash.advisor.rates import SIM_SOURCE, host_link_gbps, measured_rates, sim_rates
from gpudash.telemetry.topology import GpuFacts, TopologyFacts

OVERLAP_LAYERS = 8


@dataclass(frozen=True, slots=True)
class OverlapRow:
    """One GPU's baseline. `achieved_s` (wall time per layer, compute and copies overlapped) exists only
    where the overlap was run; the ideal it compares with is `result.t_overlapped_s`."""

    gpu: int
    name: str
    source: str  # "sim profile" | "measured (CuPy fp16)"
    comm: str  # what T_comm moves, over which route
    comm_gbps: float
    mem_bw_gbps: float
    result: Overlap
    achieved_s: float | None = None


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:.0f} KB"


def group(topology: TopologyFacts, tp: int) -> list[GpuFacts]:
    """The GPUs the layer runs on: every GPU on its own for tp=1, else the first `tp` GPUs."""
    if tp > len(topology.gpus):
        raise ValueError(f"--tp {tp} needs {tp} GPUs but {topology.source} has {len(topology.gpus)}; "
                         f"pass --tp {len(topology.gpus)} or less")
    return list(topology.gpus) if tp == 1 else list(topology.gpus[:tp])


def _sim_route(topology: TopologyFacts, g: GpuFacts, shape: LayerShape) -> tuple[float, float, str]:
    """(GB/s, latency us, description) of the route the layer's communication takes on a sim rig."""
    rig = get_profile(topology.profile or "")
    latency = rig.gpus[g.index].link_latency_us
    link = host_link_gbps(g)
    if shape.tp == 1:
        return link, latency, f"weights {_size(shape.weight_bytes)} over host PCIe gen{g.link_gen} x{g.link_width}"
    peer = (g.index + 1) % shape.tp
    what = f"2 all-reduces of {_size(shape.allreduce_bytes)}"
    gbps = rig.peer_gbps(g.index, peer)
    if gbps is not None:
        return gbps, latency, f"{what} over {'NVLink' if topology.nvlink else 'PCIe P2P'}"
    other = host_link_gbps(topology.gpus[peer])
    # no P2P: each step goes up one GPU's link into host memory and down the other's
    return min(link, other) / 2, 2 * latency, f"{what} staged through host memory (no P2P)"


def sim_baseline(topology: TopologyFacts, shape: LayerShape) -> list[OverlapRow]:
    """Roofline arithmetic from the sim rig's profile rates and links."""
    rates = sim_rates(topology)
    rows = []
    for g in group(topology, shape.tp):
        r = rates[g.index]
        gbps, latency, route = _sim_route(topology, g, shape)
        tc = compute_time_s(shape, r.mem_bw_gbps, r.matmul_tflops)
        tm = comm_time_s(shape, gbps, latency)
        rows.append(OverlapRow(g.index, g.name, SIM_SOURCE, route, gbps, r.mem_bw_gbps,
                               analyse(tc, tm, shape.weight_bytes, r.mem_bw_gbps)))
    return rows


def _copy_time_s(engine: Any, dst: Any, src: Any, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.copy(dst, src).wait()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_overlap(engine: Any, gpu: int, shape: LayerShape, layers: int = OVERLAP_LAYERS) -> float:
    """Wall seconds per layer with `layers` layers computed on one stream while the engine copies a
    layer's weights per layer to the same GPU (the prefetch a deferred pipeline does)."""
    import cupy as cp

    from gpudash.advisor import measure

    with cp.cuda.Device(gpu):
        ops = measure.layer_operands(shape)
        dev = cp.empty(shape.weight_bytes, dtype=cp.uint8)
        host = engine.alloc_host(shape.weight_bytes)
        stream = cp.cuda.Stream(non_blocking=True)
        errors: list[BaseException] = []

        def copies() -> None:
            try:
                for _ in range(layers):
                    engine.copy(dev, host).wait()
            except BaseException as err:  # re-raised below, on the caller's thread
                errors.append(err)

        with stream:
            measure.run_layer(ops)  # warm-up
        stream.synchronize()
        mover = threading.Thread(target=copies, name="gpudash-overlap-copies")
        t0 = time.perf_counter()
        mover.start()
        with stream:
            for _ in range(layers):
                measure.run_layer(ops)
        stream.synchronize()
        mover.join()
        wall = time.perf_counter() - t0
        host.free()
        if errors:
            raise errors[0]
        return wall / layers


def measured_baseline(topology: TopologyFacts, shape: LayerShape, engine: Any) -> list[OverlapRow]:
    """T_compute from CuPy matmuls of the layer's shapes; T_comm over the measured route; the
    overlap run (tp=1, where the engine moves the weights) for achieved against ideal."""
    import cupy as cp

    from gpudash.advisor import measure

    rates = measured_rates(topology)
    rows = []
    for g in group(topology, shape.tp):
        r = rates[g.index]
        tc = measure.layer_time_s(g.index, shape)
        achieved = None
        if shape.tp == 1:
            with cp.cuda.Device(g.index):
                dev = cp.empty(shape.weight_bytes, dtype=cp.uint8)
            host = engine.alloc_host(shape.weight_bytes)
            tm = _copy_time_s(engine, dev, host)
            host.free()
            gbps, route = shape.weight_bytes / tm / 1e9, f"weights {_size(shape.weight_bytes)}, engine H2D"
            achieved = run_overlap(engine, g.index, shape)
        else:
            peer = (g.index + 1) % shape.tp
            gbps, latency_us = measure.peer_copy(g.index, peer)
            tm = comm_time_s(shape, gbps, latency_us)
            route = (f"2 all-reduces of {_size(shape.allreduce_bytes)}, GPU {g.index}->{peer} "
                     f"copy measured (P2P {topology.p2p[g.index][peer]})")
        rows.append(OverlapRow(g.index, g.name, r.source, route, gbps, r.mem_bw_gbps,
                               analyse(tc, tm, shape.weight_bytes, r.mem_bw_gbps), achieved))
    return rows
