"""`gpudash fleet`: every box a Prometheus scrapes, one row each, printed once (what `status` is to one box).

The fleet is read through Prometheus' HTTP API only (gpudash/fleet): dcgm-exporter's GPU series, vLLM's
and llama-server's own, and gpudash's where it runs; per box its GPUs, util, VRAM, PCIe TX/RX against
what the links carry, its servers with their TTFT p90 and prefix-cache hit rate, and the alerts firing.
Every error is one line starting "gpudash: ": a usage error exits 2 before anyone is asked; Prometheus
down, slow, dripping or answering garbage exits 1 within the timeout. Labels are shown as text
(gpudash/outside.py): no escape sequence or Rich markup from a label reaches the terminal.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, NoReturn

import click

from gpudash.commands.common import pass_config, usage_error
from gpudash.commands.json_out import emit
from gpudash.commands.output import echo_fitted
from gpudash.config import Config
from gpudash.fleet.boxes import Fleet
from gpudash.fleet.cells import COLUMNS, RIGHT, SERVER_COLUMNS, box_cells, server_cells
from gpudash.outside import markup_free


def fleet_json(fleet: Fleet) -> dict:
    """The fleet as one JSON object: each box with its totals, targets, GPUs and servers (each figure with the
    series it came from, under "sources")."""
    boxes = [{**dataclasses.asdict(b), "exports": list(b.exports)} for b in fleet.boxes]
    return {"prometheus": fleet.url, "ts": fleet.ts, "boxes": boxes}


def _table(title: str, columns: tuple[str, ...], rows: list[dict[str, str]]) -> Any:
    from rich.table import Table

    table = Table(title=markup_free(title), title_justify="left", box=None, header_style="bold")
    for col in columns:
        table.add_column(col, justify="right" if col in RIGHT else "left", overflow="fold")
    for row in rows:
        table.add_row(*(markup_free(row[c]) for c in columns))
    return table


def _fail(message: str) -> NoReturn:
    """The fleet could not be read (not a usage error): one sentence as usage_error prints one, exit 1."""
    echo_fitted([f"gpudash: {message}"], "    ", err=True)
    sys.exit(1)


def _seconds(text: str) -> float:
    """--timeout's value (checked here, so that its error reads like every other of this command's)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 120:
        usage_error(f"--timeout expects seconds from 0.1 to 120 (e.g. 5), got {text!r}")
    return value


@click.command()
@click.option("--prometheus", "url", metavar="URL", default=None,
              help="Prometheus' base URL, e.g. http://prometheus.lan:9090 (default: [fleet] prometheus).")
@click.option("--job", default=None, help="Only targets of these jobs, a regular expression (default: [fleet] job, "
              "else every job that exports gpudash, dcgm-exporter, vLLM or llama-server series).")
@click.option("--timeout", "timeout_text", metavar="SECONDS", default=None,
              help="Seconds the whole read may take, 0.1 to 120 (default: [fleet] timeout_s).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print one JSON object instead of the table.")
@pass_config
def fleet(cfg: Config, url: str | None, job: str | None, timeout_text: str | None, as_json: bool) -> None:
    """Print every box a Prometheus scrapes: GPUs, util, VRAM, PCIe, servers, TTFT, hit rate and alerts."""
    from rich.console import Console

    from gpudash.fleet.boxes import read_fleet
    from gpudash.fleet.client import PrometheusClient, PrometheusError

    timeout_s = _seconds(timeout_text) if timeout_text is not None else cfg.fleet.timeout_s
    url = url or cfg.fleet.prometheus
    if not url:
        usage_error("no Prometheus to ask: pass --prometheus URL (e.g. http://prometheus.lan:9090) or set "
                    "[fleet] prometheus in the config")
    try:
        client = PrometheusClient(url, timeout_s)
    except ValueError as err:
        usage_error(str(err))
    try:
        with client:
            snapshot = read_fleet(client, job or cfg.fleet.job)
    except PrometheusError as err:
        _fail(str(err))
    if as_json:
        emit("fleet", fleet_json(snapshot), indent=1)
        return
    now = time.time()
    console = Console(width=None if Console().is_terminal else 200)  # a pipe gets whole lines
    if not snapshot.boxes:
        console.print(markup_free(f"Prometheus at {snapshot.url} scrapes no gpudash, dcgm-exporter, vLLM or "
                                  "llama-server targets" + (" of that job" if job or cfg.fleet.job else "")))
        return
    console.print(_table(f"fleet: {len(snapshot.boxes)} boxes from {snapshot.url}", COLUMNS,
                         [box_cells(b, now) for b in snapshot.boxes]))
    servers = [server_cells(b, s) for b in snapshot.boxes for s in b.servers]
    console.print(_table("servers", SERVER_COLUMNS, servers) if servers else "no servers on any box")
