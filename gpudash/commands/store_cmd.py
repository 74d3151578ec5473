"""`gpudash store prune|vacuum`: apply the [store] retention policy now, and compact the file."""

from __future__ import annotations

import sqlite3

import click

from gpudash import fmt
from gpudash.commands.groups import Group
from gpudash.commands.common import db_option, db_path, pass_config, usage_error
from gpudash.commands.output import echo_fitted
from gpudash.config import Config


@click.group(cls=Group)
def store() -> None:
    """Keep the SQLite store bounded: prune by the [store] retention policy, vacuum to shrink the file."""


@store.command()
@db_option
@click.option("--raw-days", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Keep full-resolution samples this many days (default: [store] raw_days).")
@click.option("--retain-days", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Delete everything older than this many days (default: [store] retain_days).")
@click.option("--max-bytes", default=None, help="Delete the oldest data above this size, e.g. 20GB "
                                               "(default: [store] max_bytes).")
@pass_config
def prune(cfg: Config, db: str | None, raw_days: float | None, retain_days: float | None,
          max_bytes: str | None) -> None:
    """Fold old samples into 1-minute means and maxima, and delete what is past retention or the size cap."""
    from pydantic import ValidationError

    from gpudash.config import StoreConfig
    from gpudash.store.retention import Retention
    from gpudash.store.retention import prune as apply

    try:
        settings = StoreConfig.model_validate({
            **cfg.store.model_dump(),
            **{k: v for k, v in (("raw_days", raw_days), ("retain_days", retain_days), ("max_bytes", max_bytes))
               if v is not None}})
    except ValidationError as err:
        e = err.errors()[0]
        usage_error(f"--{str(e['loc'][0]).replace('_', '-')}: {e['msg'].removeprefix('Value error, ')}")
    store = _open(cfg, db)
    try:
        report = apply(store.db, Retention.from_config(settings))
    except sqlite3.Error as err:
        usage_error(f"pruning {store.path} failed ({err}); nothing past the last completed step was changed")
    finally:
        store.close()
    echo_fitted([f"pruned {store.path}: {report.rolled_rows} rows folded into 1-minute rows, "
                 f"{report.deleted_rows} rows and {report.deleted_sessions} sessions deleted; data "
                 f"{fmt.size(report.bytes_before)} -> {fmt.size(report.bytes_after)}"], "    ")


@store.command()
@db_option
@pass_config
def vacuum(cfg: Config, db: str | None) -> None:
    """Rewrite the file without its free pages (needs as much free disk as the file; waits for writers)."""
    from gpudash.store.retention import vacuum as compact

    store = _open(cfg, db)
    before = store.path.stat().st_size
    try:
        compact(store.db)
    except sqlite3.Error as err:
        usage_error(f"vacuum of {store.path} failed ({err}); the file is unchanged")
    finally:
        store.close()
    echo_fitted([f"vacuumed {store.path}: {fmt.size(before)} -> {fmt.size(store.path.stat().st_size)}"], "    ")


def _open(cfg: Config, db: str | None):
    from gpudash.store import Store, StoreError

    path = db_path(cfg, db)
    if not path.exists():
        usage_error(f"no database at {path}; record a session with `gpudash record` or pass --db")
    try:
        return Store.open(path)
    except StoreError as err:
        usage_error(str(err))
