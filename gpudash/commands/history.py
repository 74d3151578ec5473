"""`gpudash history`: the recorded sessions, newest last, with their row counts."""

from __future__ import annotations

import click

from gpudash import fmt
from gpudash.commands.common import db_option, db_path, pass_config, usage_error
from gpudash.config import Config
from gpudash.outside import printable

# Short names for the row-count column of the table view.
_SHORT = {"gpu_samples": "gpu", "gpu_process_samples": "gpu_proc", "host_samples": "host",
          "process_samples": "proc", "engine_path_samples": "engine", "pool_samples": "slab",
          "pool_shard_samples": "pool", "server_samples": "server", "requests": "req", "events": "event"}


def _label(table: str) -> str:
    """A table's short name; the 1-minute tier of `gpu_samples` is `gpu/1m`."""
    base = table.removesuffix("_1m")
    return _SHORT.get(base, base) + ("/1m" if base != table else "")


@click.command()
@db_option
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the sessions as a JSON array.")
@pass_config
def history(cfg: Config, db: str | None, as_json: bool) -> None:
    """List recorded sessions: start, end, duration, source, what recorded them and row counts per table.

    A session without an end shows as live (its writer runs), interrupted (its writer is gone) or open
    (written on another host); `what` names the command that recorded it (gpudash record, gpudash bench
    engine...)."""
    from gpudash.runtime.history import StoreError, recorded_sessions

    path = db_path(cfg, db)
    if not path.exists():
        usage_error(f"no database at {path}; record a session with `gpudash record` or pass --db")
    try:
        sessions = recorded_sessions(path)
    except StoreError as err:
        usage_error(str(err))
    if as_json:
        click.echo(fmt.json_text([s.as_dict() for s in sessions], indent=2))
        return
    if not sessions:
        click.echo(f"no sessions in {path}")
        return
    # a database file may hold anything another tool wrote: its text is shown as text (outside.py)
    shown = {s.id: (printable(s.source), printable(s.note or fmt.NA)) for s in sessions}
    source = max(18, *(len(src) for src, _ in shown.values()))  # columns as wide as their longest value
    what = max(len("what"), *(len(note) for _, note in shown.values()))
    click.echo(f"{'id':>4}  {'started':19}  {'ended':19}  {'duration':>9}  {'source':{source}}  {'what':{what}}  rows")
    for s in sessions:
        rows = ", ".join(f"{_label(t)} {n}" for t, n in s.rows.items() if n and t != "ticks")
        click.echo(f"{s.id:>4}  {fmt.clock(s.started):19}  {fmt.session_end(s.ended, s.state):19}  "
                   f"{fmt.duration(s.duration_s):>9}  {shown[s.id][0]:{source}}  {shown[s.id][1]:{what}}  "
                   f"ticks {s.rows.get('ticks', 0)}{', ' + rows if rows else ''}")
