"""`gpudash history`: the recorded sessions, newest last, with their row counts."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import click
from rich.table import Table

from gpudash import fmt
from gpudash.commands.common import db_option, db_path, pass_config, usage_error
from gpudash.commands.json_out import emit
from gpudash.commands.output import console, fitted_tables, plain_table, print_tables
from gpudash.config import Config
from gpudash.outside import markup_free

if TYPE_CHECKING:
    from gpudash.store import SessionInfo
    from gpudash.store.energy import SessionEnergy

# Short names for the row-count column of the table view.
_SHORT = {"gpu_samples": "gpu", "gpu_process_samples": "gpu_proc", "host_samples": "host",
          "process_samples": "proc", "engine_path_samples": "engine", "pool_samples": "slab",
          "pool_shard_samples": "pool", "server_samples": "server", "requests": "req", "events": "event",
          "server_energy_samples": "energy"}
# The columns in groups, each table led by the session id: one table where the terminal is wide enough,
# else one table a group (80 columns), the long cells (what recorded it, the row counts) wrapped.
GROUPS = ("when", "what", "energy")


def _label(table: str) -> str:
    """A table's short name; the 1-minute tier of `gpu_samples` is `gpu/1m`."""
    base = table.removesuffix("_1m")
    return _SHORT.get(base, base) + ("/1m" if base != table else "")


def _ended(s: SessionInfo) -> str:
    """The end as a time of day when the session ended the day it started, else the full date."""
    if s.ended is not None and time.localtime(s.ended)[:3] == time.localtime(s.started)[:3]:
        return time.strftime("%H:%M:%S", time.localtime(s.ended))
    return fmt.session_end(s.ended, s.state)


def _rows(s: SessionInfo) -> str:
    counts = ", ".join(f"{_label(t)} {n}" for t, n in s.rows.items() if n and t != "ticks")
    return f"ticks {s.rows.get('ticks', 0)}{', ' + counts if counts else ''}"


def _energy(servers: Sequence[SessionEnergy]) -> str:
    """Each server's joules per generated token over the session ("—" where it generated none)."""
    return ", ".join(f"{markup_free(e.server)} {fmt.num(e.j_per_token, '.3g', ' J')}" for e in servers) or fmt.NA


def _table(sessions: Sequence[SessionInfo], groups: Sequence[str],
           energy: Mapping[int, Sequence[SessionEnergy]] | None = None) -> Table:
    table = plain_table()
    table.add_column("id", justify="right", no_wrap=True)
    if "when" in groups:
        for name in ("started", "ended", "duration", "source"):
            table.add_column(name, justify="right" if name == "duration" else "left", no_wrap=True)
    if "what" in groups:
        table.add_column("what", min_width=14)
        table.add_column("rows", min_width=28)
    if "energy" in groups:
        table.add_column("J/token", min_width=10)
    for s in sessions:  # a database file may hold anything another tool wrote: its text is shown as text
        cells = [str(s.id)]
        if "when" in groups:
            cells += [fmt.clock(s.started), _ended(s), fmt.duration(s.duration_s), markup_free(s.source)]
        if "what" in groups:
            cells += [markup_free(s.note or fmt.NA), _rows(s)]
        if "energy" in groups:
            cells.append(_energy((energy or {}).get(s.id, ())))
        table.add_row(*cells)
    if len(groups) < len(GROUPS):
        table.title = {"when": "sessions: when and where", "what": "what recorded them, and their rows",
                       "energy": "joules per generated token, per server"}[groups[0]]
    return table


def _actions(actions: Sequence[SessionInfo]) -> Table:
    """Server actions (sleep, wake) apart from the sessions: each is a moment with its events, not a
    recording of 0 s."""
    table = plain_table(title="server actions (their events; no samples)")
    for name in ("id", "at", "what", "rows"):
        table.add_column(name, justify="right" if name == "id" else "left", no_wrap=name != "what")
    for s in actions:
        table.add_row(str(s.id), fmt.clock(s.started), markup_free(s.note or fmt.NA), _rows(s))
    return table


@click.command()
@db_option
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the sessions as a JSON array.")
@pass_config
def history(cfg: Config, db: str | None, as_json: bool) -> None:
    """List recorded sessions: start, end, duration, source, what recorded them, row counts per table and each
    server's joules per generated token over the session.

    A session without an end shows as live (its writer runs), interrupted (its writer is gone) or open
    (written on another host); `what` names the command that recorded it (gpudash launch, gpudash record,
    gpudash bench engine...). Server actions (`gpudash server sleep|wake`) are listed apart, below. The
    table fits the terminal; piped, each session is one line."""
    from gpudash.runtime.history import StoreError, is_action, recorded_energy, recorded_sessions

    path = db_path(cfg, db)
    if not path.exists():
        usage_error(f"no database at {path}; record a session with `gpudash record` or pass --db")
    try:
        sessions = recorded_sessions(path)
        energy = recorded_energy(path)
    except StoreError as err:
        usage_error(str(err))
    if as_json:
        emit("history", {"sessions": [{**s.as_dict(), "energy": [e.as_dict() for e in energy.get(s.id, ())]}
                                      for s in sessions]})
        return
    if not sessions:
        click.echo(f"no sessions in {path}")
        return
    out = console()
    recordings = [s for s in sessions if not is_action(s)]
    actions = [s for s in sessions if is_action(s)]
    tables = fitted_tables(out, GROUPS, lambda groups: _table(recordings, groups, energy)) if recordings else []
    print_tables(out, tables + ([_actions(actions)] if actions else []))
