"""`gpudash status`: one look at the GPUs, their PCIe links and the processes on them, printed once for
scripts and ssh sessions (what `nvitop -1` is to nvitop). Rates need two reads, `--window` apart."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import click

from gpudash import fmt
from gpudash.commands.common import pass_config, resolve_rig, sim_options
from gpudash.config import Config
from gpudash.records import Snapshot


def _tables(snap: Snapshot) -> list:
    """The GPU table and the process table, as rich renderables."""
    from rich.table import Table

    from gpudash.tui.state import link_status

    gpus = Table(title=f"{snap.source}{'  (simulated rig, not real GPUs)' if snap.is_sim else ''}",
                 title_justify="left", box=None, header_style="bold")
    for col in ("GPU", "name", "util", "memory", "power", "temp", "SM clock (held by)", "ECC/remapped",
                "link (max)", "PCIe TX", "RX"):
        gpus.add_column(col, justify="right" if col in ("util", "power", "temp", "PCIe TX", "RX") else "left")
    for g in snap.gpus:
        link = link_status(g)
        gpus.add_row(str(g.index), g.name.removeprefix("NVIDIA "), fmt.num(g.util_pct, ".0f", "%"),
                     f"{fmt.size(g.mem_used)} / {fmt.size(g.mem_total)}", fmt.num(g.power_w, ".0f", " W"),
                     fmt.num(g.temp_c, ".0f", " °C"),
                     f"{fmt.num(g.sm_clock_mhz, 'd', ' MHz')} ({g.throttle or 'NA'})",
                     f"{fmt.num(g.ecc_uncorrected, 'd')}/{fmt.num(g.remapped_rows, 'd')}",
                     f"[bold red]{link.text} DOWNGRADED[/]" if link.warn else link.text,
                     f"{fmt.rate(g.pcie_tx_bps)} {fmt.pct(link.tx_fraction)}",
                     f"{fmt.rate(g.pcie_rx_bps)} {fmt.pct(link.rx_fraction)}")
    procs = Table(title="processes", title_justify="left", box=None, header_style="bold")
    for col in ("GPU", "PID", "name", "server", "VRAM"):
        procs.add_column(col, justify="right" if col in ("GPU", "PID", "VRAM") else "left")
    for p in sorted(snap.gpu_processes, key=lambda p: (p.gpu_index, -(p.used_bytes or 0))):
        procs.add_row(str(p.gpu_index), str(p.pid), p.name or fmt.NA, p.server or fmt.NA, fmt.size(p.used_bytes))
    out = [gpus, procs if snap.gpu_processes else "no processes on the GPUs"]
    h = snap.host
    if h is not None:
        out.append(f"host CPU {fmt.num(h.cpu_pct, '.0f', '%')}  memory {fmt.size(h.mem_used)} / "
                   f"{fmt.size(h.mem_total)}")
    out.extend(f"[red]{e}[/]" for e in snap.errors)
    return out


@click.command()
@sim_options
@click.option("--json", "as_json", is_flag=True, default=False,
              help="Print one JSON object (gpus, gpu_processes, host, errors) instead of tables.")
@click.option("--window", type=click.FloatRange(min=0.05, max=10), default=0.5, show_default=True,
              help="Seconds between the two reads that PCIe rates are measured over.")
@pass_config
def status(cfg: Config, sim: str | None, no_sim: bool, as_json: bool, window: float) -> None:
    """Print the GPUs, their links and the processes on them once, then exit (like `nvitop -1`)."""
    from gpudash.telemetry.factory import build_sources
    from gpudash.telemetry.sampler import Sampler

    rig = resolve_rig(cfg, sim, no_sim, quiet=as_json)
    try:
        sampler = Sampler(build_sources(rig, cfg), window, rig.label, source_timeout_s=cfg.sampling.source_timeout_s)
    except Exception as err:  # a driver or native library that will not start: say which, stop
        raise click.ClickException(f"cannot read the {rig.label} telemetry: {type(err).__name__}: {err}") from None
    try:
        sampler.poll_once()  # the first read starts the counters that rates are measured against
        time.sleep(window)
        snap = sampler.poll_once()
    finally:
        sampler.stop()
    if as_json:
        doc = {"source": snap.source, "sim": snap.is_sim, "ts": snap.ts,
               "gpus": [dataclasses.asdict(g) for g in snap.gpus],
               "gpu_processes": [dataclasses.asdict(p) for p in snap.gpu_processes],
               "host": None if snap.host is None else dataclasses.asdict(snap.host), "errors": list(snap.errors)}
        click.echo(json.dumps(doc, indent=1))
        return
    from rich.console import Console

    # In a terminal, its width; piped into a script or a file, wide enough that no row wraps or is cut.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
    for part in _tables(snap):
        console.print(part)
