"""`gpudash launch`: the dashboard on the live rig (real GPUs, or the labelled sim rig), with the
configured servers (or the launcher's embedded demo) supervised and recorded."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from gpudash.commands.common import db_option, db_path, pass_config, resolve_rig, sim_options, usage_error
from gpudash.config import Config, default_config_path


def check_keys(keys: dict[str, str]) -> None:
    """[keys] may only remap binding ids the app has (one sentence naming the bad id otherwise)."""
    from gpudash.tui.app import GpudashApp

    known = sorted(b.id for b in GpudashApp.BINDINGS if b.id)
    bad = sorted(set(keys) - set(known))
    if bad:
        usage_error(f"[keys] names unknown action id {', '.join(bad)}; use one of: {', '.join(known)}")


@click.command()
@sim_options
@db_option
@click.option("--no-record", is_flag=True, default=False, help="Do not record to the DB (toggle later with r).")
@click.option("--fleet", "fleet_url", metavar="URL", default=None,
              help="Prometheus' base URL for the Fleet tab (default: [fleet] prometheus; unset: no fleet is read).")
@pass_config
def launch(config: Config, sim: str | None, no_sim: bool, db: str | None, no_record: bool,
           fleet_url: str | None) -> None:
    """Open the live dashboard: GPUs, PCIe, servers, latency, engine, pools, history, events, fleet."""
    rig = resolve_rig(config, sim, no_sim)
    check_keys(config.keys)
    if fleet_url is not None:
        from gpudash.config import prometheus_url

        try:
            config = config.model_copy(update={"fleet": config.fleet.model_copy(
                update={"prometheus": prometheus_url(fleet_url)})})
        except ValueError as err:
            usage_error(f"--fleet: {err}")
    path = db_path(config, db)
    if not no_record:  # a DB that cannot be used is a usage error now, not a failure inside the screen
        from gpudash.runtime.run import check_store
        from gpudash.store import StoreError

        try:
            check_store(path)
        except StoreError as err:
            usage_error(str(err))
    from gpudash.runtime.feed import LiveFeed
    from gpudash.runtime.signals import StopSignals
    from gpudash.tui.app import GpudashApp

    feed = LiveFeed(config, rig, path, record=not no_record)
    app = GpudashApp(feed, keys=config.keys, config_path=Path(
        click.get_current_context().find_root().obj.get("config_path") or default_config_path()))
    # SIGTERM (systemd, kill) and SIGHUP (a dropped ssh) quit like the quit key, so the servers stop, the
    # session closes and the terminal leaves the alternate screen (Ctrl-C is a key the app reads itself).
    try:
        with StopSignals(lambda: app.call_later(app.exit), (signal.SIGTERM, signal.SIGHUP), silence_on_hangup=False):
            app.run()
    finally:
        feed.close()  # idempotent: normally the app already stopped everything on quit
