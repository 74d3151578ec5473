"""`gpudash status`: one look at the GPUs, their PCIe links and the processes on them, printed once for
scripts and ssh sessions (what `nvitop -1` is to nvitop). Rates need two reads, `--window` apart."""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
import time
import click
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from gpudash import fmt
from gpudash.commands.common import pass_config, resolve_rig, sim_options
from gpudash.commands.json_out import emit
from gpudash.config import Config
from gpudash.outside import markup_free
from gpudash.records import GpuSample, Snapshot
from gpudash.telemetry.links import link_status


# The GPU table's columns in groups: one table when the terminal is wide enough, else one table a group,
# each led by the GPU's index and name, so that at 80 columns nothing wraps and nothing is hidden.
COLUMNS: dict[str, tuple[str, ...]] = {
    "GPUs": ("busy", "memory used", "power", "temp"),
    "PCIe links": ("link", "link max", "GPU to host", "host to GPU"),
    "clocks and errors": ("SM clock", "held down by", "ECC errors", "remapped rows"),
}
GROUPS = tuple(COLUMNS)
_LEFT = {"memory used", "link", "link max", "held down by"}
_WRAPS = {"held down by"}  # clock-event reasons: a list that may be long


def _cells(g: GpuSample) -> dict[str, tuple[str, ...]]:
    """One GPU's cells per group, in COLUMNS' order; NA shows as an em dash."""
    link = link_status(g)
    now = _link(g.link_gen, g.link_width)
    held = markup_free(fmt.held_down_by(g.throttle))
    memory = (fmt.NA if g.mem_used is None and g.mem_total is None
              else f"{fmt.size(g.mem_used)} of {fmt.size(g.mem_total)}")
    return {
        "GPUs": (fmt.num(g.util_pct, ".0f", "%"), memory, fmt.num(g.power_w, ".0f", " W"),
                 fmt.num(g.temp_c, ".0f", " °C")),
        "PCIe links": (f"[bold red]{now} LOW[/]" if link.warn else now, _link(g.link_gen_max, g.link_width_max),
                       _rate(g.pcie_tx_bps, link.tx_fraction), _rate(g.pcie_rx_bps, link.rx_fraction)),
        "clocks and errors": (fmt.num(g.sm_clock_mhz, "d", " MHz"), held, fmt.num(g.ecc_uncorrected, "d"),
                              fmt.num(g.remapped_rows, "d")),
    }


def _short_name(name: str) -> str:
    """The model without the vendor and brand words every card of a box shares: RTX 5080, H200 NVL."""
    return name.removeprefix("NVIDIA ").removeprefix("GeForce ")


def _link(gen: int | None, width: int | None) -> str:
    return fmt.NA if gen is None and width is None else f"gen{gen or '?'} x{width or '?'}"


def _rate(bps: float | None, fraction: float | None) -> str:
    """A PCIe rate and the share of the link it takes: 12.30 GB/s 45%."""
    return fmt.NA if bps is None else f"{fmt.rate(bps)} {fmt.pct(fraction)}"


def _gpu_table(snap: Snapshot, groups: tuple[str, ...]) -> Table:
    table = Table(title_justify="left", box=None, header_style="bold", pad_edge=False)
    table.add_column("GPU", justify="right")
    table.add_column("name", no_wrap=True, overflow="ellipsis")
    for name in (n for group in groups for n in COLUMNS[group]):
        table.add_column(name, justify="left" if name in _LEFT else "right", no_wrap=name not in _WRAPS,
                         min_width=len(name))
    for g in snap.gpus:
        cells = _cells(g)
        table.add_row(str(g.index), markup_free(_short_name(g.name)),
                      *(c for group in groups for c in cells[group]))
    return table


def gpu_tables(snap: Snapshot, console: Console) -> list[Table]:
    """The GPU tables for this console's width: every column in one table when it fits, else the
    fewest tables of whole column groups that fit (one a group at 80 columns)."""
    layouts = ((GROUPS,), (GROUPS[:2], GROUPS[2:]), tuple((g,) for g in GROUPS))
    unbounded = console.options.update_width(10_000)  # measure a table's natural width, not the console's
    for layout in layouts:
        tables = [_gpu_table(snap, groups) for groups in layout]
        if layout is layouts[-1] or all(Measurement.get(console, unbounded, t).maximum <= console.width
                                        for t in tables):
            break
    if len(tables) > 1:
        for table, groups in zip(tables, layout):
            table.title = " and ".join(groups)
    return tables


def render(snap: Snapshot, console: Console) -> None:
    """Print the whole status: the rig line, the GPU tables, the processes, the host, any source errors."""
    console.print(f"[bold]{markup_free(snap.source)}[/]{'  (simulated rig, not real GPUs)' if snap.is_sim else ''}")
    for table in gpu_tables(snap, console):
        console.print(table)
    if snap.gpu_processes:
        procs = Table(title="processes on the GPUs", title_justify="left", box=None, header_style="bold",
                      pad_edge=False)
        for col in ("GPU", "PID", "process", "server", "GPU memory", "SM use"):
            procs.add_column(col, justify="left" if col in ("process", "server") else "right",
                             no_wrap=col != "process", overflow="ellipsis")
        for p in sorted(snap.gpu_processes, key=lambda p: (p.gpu_index, -(p.used_bytes or 0))):
            # a process's name is whatever its owner called it: shown as text (outside.py)
            procs.add_row(str(p.gpu_index), str(p.pid), markup_free(p.name or fmt.NA), markup_free(p.server or fmt.NA),
                          fmt.size(p.used_bytes), fmt.num(p.sm_pct, ".0f", "%"))
        console.print(procs)
    else:
        console.print("no processes on the GPUs")
    h = snap.host
    if h is not None:
        console.print(f"host: CPU busy {fmt.num(h.cpu_pct, '.0f', '%')}, memory used {fmt.size(h.mem_used)} of "
                      f"{fmt.size(h.mem_total)}")
    for e in snap.errors:
        console.print(f"[red]{markup_free(e)}[/]")


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
    from gpudash.launcher.discovery import find_servers, found_lines

    # inference servers gpudash did not start: on the GPUs (a simulated rig's processes are modelled, so none)
    # and by their command lines (a server on the CPU)
    found = find_servers([] if snap.is_sim else [(p.gpu_index, p.pid) for p in snap.gpu_processes], by_cmdline=True)
    if as_json:
        doc = {"source": snap.source, "sim": snap.is_sim, "ts": snap.ts,
               "gpus": [dataclasses.asdict(g) for g in snap.gpus],
               "gpu_processes": [dataclasses.asdict(p) for p in snap.gpu_processes],
               "host": None if snap.host is None else dataclasses.asdict(snap.host), "errors": list(snap.errors),
               "found_servers": [dataclasses.asdict(f) for f in found]}
        emit("status", doc, indent=1)
        return
    # In a terminal (or with COLUMNS set), its width; piped into a script or a file, wide enough for one table.
    wide = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
    console = Console(highlight=False, width=None if wide else 240)
    render(snap, console)
    for line in found_lines(found):  # a wrapped line keeps its indent, and two more (it lost it)
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        for piece in textwrap.wrap(line, console.width, subsequent_indent=indent, break_long_words=False,
                                   break_on_hyphens=False):
            console.print(markup_free(piece), soft_wrap=True)
