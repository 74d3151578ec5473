"""`gpudash fleet`: every box a Prometheus scrapes, one row each, printed once (what `status` is to one box).

The fleet is read through Prometheus' HTTP API only (gpudash/fleet): GPUs, util, VRAM, PCIe TX/RX against
what the links carry, the servers with their TTFT p90 and prefix-cache hit rate, and the alerts firing.
Prometheus down, slow or answering garbage ends in one sentence (exit 1) within the timeout.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import click

from gpudash.commands.common import pass_config, usage_error
from gpudash.config import Config
from gpudash.fleet.boxes import Fleet
from gpudash.fleet.cells import COLUMNS, RIGHT, SERVER_COLUMNS, box_cells, server_cells


def fleet_json(fleet: Fleet) -> dict:
    return {"prometheus": fleet.url, "ts": fleet.ts, "boxes": [dataclasses.asdict(b) for b in fleet.boxes]}


def _table(title: str, columns: tuple[str, ...], rows: list[dict[str, str]]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    for col in columns:
        table.add_column(col, justify="right" if col in RIGHT else "left", overflow="fold")
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    return table


@click.command()
@click.option("--prometheus", "url", metavar="URL", default=None,
              help="Prometheus' base URL, e.g. http://prometheus.lan:9090 (default: [fleet] prometheus).")
@click.option("--job", default=None, help="Only targets of this scrape job (default: [fleet] job, else every job).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=120), default=None,
              help="Seconds the whole read may take (default: [fleet] timeout_s).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print one JSON object instead of the table.")
@pass_config
def fleet(cfg: Config, url: str | None, job: str | None, timeout_s: float | None, as_json: bool) -> None:
    """Print every box a Prometheus scrapes: GPUs, util, VRAM, PCIe, servers, TTFT, hit rate and alerts."""
    from rich.console import Console

    from gpudash.fleet.boxes import read_fleet
    from gpudash.fleet.client import PrometheusClient, PrometheusError

    url = url or cfg.fleet.prometheus
    if not url:
        usage_error("no Prometheus to ask: pass --prometheus URL (e.g. http://prometheus.lan:9090) or set "
                    "[fleet] prometheus in the config")
    try:
        client = PrometheusClient(url, timeout_s or cfg.fleet.timeout_s)
    except ValueError as err:
        usage_error(str(err))
    try:
        with client:
            snapshot = read_fleet(client, job or cfg.fleet.job)
    except PrometheusError as err:
        raise click.ClickException(str(err)) from None
    if as_json:
        click.echo(json.dumps(fleet_json(snapshot), indent=1))
        return
    now = time.time()
    console = Console(width=None if Console().is_terminal else 200)  # a pipe gets whole lines
    if not snapshot.boxes:
        console.print(f"Prometheus at {snapshot.url} scrapes no targets")
        return
    console.print(_table(f"fleet: {len(snapshot.boxes)} boxes from {snapshot.url}", COLUMNS,
                         [box_cells(b, now) for b in snapshot.boxes]))
    servers = [server_cells(b, s) for b in snapshot.boxes for s in b.servers]
    console.print(_table("servers", SERVER_COLUMNS, servers) if servers else "no servers on any box")
