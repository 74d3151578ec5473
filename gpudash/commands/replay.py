"""`gpudash replay SESSION|latest`: the dashboard's views fed from a recorded session, with pause, step,
seek and speed keys."""

from __future__ import annotations

import click

from gpudash.commands.common import db_option, db_path, pass_config, usage_error
from gpudash.commands.launch import check_keys
from gpudash.config import Config


@click.command()
@click.argument("session", default="latest")
@db_option
@click.option("--speed", type=float, default=1.0, show_default=True,
              help="Playback speed (recorded time / wall time); +/- change it while playing.")
@pass_config
def replay(config: Config, session: str, db: str | None, speed: float) -> None:
    """Replay a recorded session (an id or 'latest') in the dashboard."""
    if not speed > 0:
        usage_error(f"--speed must be above 0, got {speed:g}")
    from gpudash.runtime.replay import ReplayFeed, recorded_session
    from gpudash.store import StoreError

    path = db_path(config, db)
    try:
        sid = recorded_session(path, session)
    except StoreError as err:
        usage_error(str(err))
    check_keys(config.keys)
    from gpudash.tui.app import GpudashApp

    GpudashApp(ReplayFeed(path, str(sid)), replay=True, speed=speed, keys=config.keys).run()
