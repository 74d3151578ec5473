"""`gpudash export`: one session's tables as CSV, JSON or Parquet files, one file per table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import click

from gpudash.commands.common import db_option, db_path, pass_config, usage_error
from gpudash.config import Config


@click.command()
@click.argument("session", metavar="SESSION|latest")
@db_option
@click.option("--format", "fmt", type=click.Choice(["csv", "json", "parquet"]), required=True,
              help="File format (parquet needs pyarrow: pip install 'gpudash[parquet]').")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Directory for the files.")
@click.option("--force", is_flag=True, default=False, help="Overwrite files a previous export left there.")
@pass_config
def export(cfg: Config, session: str, db: str | None, fmt: str, out: str, force: bool) -> None:
    """Export one session, every table to its own file, each row labelled with the session's source."""
    from gpudash.runtime.history import ExportError, StoreError, export_recorded

    path = db_path(cfg, db)
    if not path.exists():
        usage_error(f"no database at {path}; record a session with `gpudash record` or pass --db")
    try:
        sid, done = export_recorded(path, session, fmt, Path(out).expanduser(), force=force)
    except (StoreError, ExportError) as err:
        usage_error(str(err))
    except sqlite3.DatabaseError as err:
        usage_error(f"{path} cannot be read ({err}); it may be damaged: `sqlite3 FILE .recover` can save "
                    "what is readable")
    total = sum(e.rows for e in done)
    click.echo(f"exported session {sid}: {len(done)} files, {total} rows, into {Path(out).expanduser()}")
