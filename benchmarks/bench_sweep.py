"""Sweep cost per telemetry tick: the 8-GPU sim rig (target <= 1 ms) and, where a driver is present,
real NVML (target <= 3 ms per H200, the 20 ms throughput query kept off the tick's path).

    PYTHONPATH=. python benchmarks/bench_sweep.py [--runs 5] [--polls 200]

Prints one row per sweep: median over runs of the per-run median poll time, the spread across runs,
the target and measured/target. Sim rows are labelled sim and are never GPU numbers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import click

from gpudash.config import Config
from gpudash.telemetry.rig import SimulatedRig
from gpudash.gpu import nvml
from gpudash.telemetry.nvml import NvmlSource
from gpudash.telemetry.host import HostSource
from gpudash.telemetry.inbox import Inbox
from gpudash.telemetry.sampler import Sampler
from gpudash.telemetry.sim import SimRigSource


def measure(fn: Callable[[], object], runs: int, polls: int) -> list[float]:
    """Per-run median seconds of `fn()` over `polls` calls, after a short warm-up."""
    for _ in range(10):
        fn()
    medians = []
    for _ in range(runs):
        times = []
        for _ in range(polls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
    return medians


def row(name: str, gpus: int, medians: list[float], target_ms: float | None) -> str:
    med = statistics.median(medians) * 1e3
    spread = f"{min(medians) * 1e3:.3f}-{max(medians) * 1e3:.3f}"
    target = f"{target_ms:.1f}" if target_ms else "-"
    ratio = f"{med / target_ms:.2f}" if target_ms else "-"
    return f"| {name:<38} | {gpus:>4} | {med:>9.3f} | {spread:>13} | {target:>9} | {ratio:>5} |"


@click.command()
@click.option("--runs", default=5, show_default=True, help="Runs per sweep (the table shows their median).")
@click.option("--polls", default=200, show_default=True, help="Polls per run.")
def main(runs: int, polls: int) -> None:
    """Print the sweep-cost table."""
    click.echo("| sweep                                  | GPUs | median ms | runs min-max  | target ms | ratio |")
    click.echo("|----------------------------------------|------|-----------|---------------|-----------|-------|")
    config = Config()
    engine = SimulatedRig("8xh20").make_engine(config)
    try:
        rig = SimRigSource("8xh20", engine, load="off")
        click.echo(row("sim:8xh20 rig source", 8, measure(rig.poll, runs, polls), 1.0))
        sampler = Sampler([rig, HostSource(), Inbox()], interval_s=1, source_label="sim:8xh20")
        click.echo(row("sim:8xh20 full tick (rig+host+inbox)", 8, measure(sampler.poll_once, runs, polls), None))
        sampler.stop()
    finally:
        engine.close()
    reason = nvml.driver_available()
    if reason is not None:
        click.echo(f"| nvml: not measured ({reason})")
        return
    src = NvmlSource()
    try:
        n = len(src.devices)
        click.echo(row(f"nvml ({src.devices[0].static.name})", n, measure(src.poll, runs, polls), 3.0 * n))
        click.echo(f"PCIe counters on GPUs {src.counter_gpus}; throughput fallback on the others "
                   f"(own threads, off the tick); counter poller interval now {src.counters.interval_s * 1e3:.0f} ms")
    finally:
        src.close()


if __name__ == "__main__":
    main()
