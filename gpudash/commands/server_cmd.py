"""`gpudash server sleep|wake NAME`: vLLM sleep mode from the command line, timed and recorded.

The server runs under `gpudash launch` / `serve` (or anything else); this command reaches it over HTTP
at its configured `port` (or --url), through the controller like every other change
(runtime/server_actions.py), and records the operation, with its duration, as an event in the store, so
model-switch times can be compared across runs (with and without the transfer engine).
"""

from __future__ import annotations

import click

from gpudash.commands.groups import Group
from gpudash.commands.common import db_option, db_path, pass_config, usage_error
from gpudash.config import Config


@click.group(cls=Group)
def server() -> None:
    """Act on one configured server."""


def _run(cfg: Config, name: str, action: str, level: int, url: str | None, db: str | None) -> None:
    from gpudash.runtime.server_actions import ActionRefused, server_action
    from gpudash.store import StoreError

    try:
        done = server_action(cfg, db_path(cfg, db), name, action, level, url)
    except (ActionRefused, StoreError) as err:
        usage_error(str(err))
    if not done.result.ok:
        if not done.asked:  # refused before the server was asked: the request itself is wrong
            usage_error(done.result.reason or f"{action} {name} was refused")
        click.echo(f"gpudash: {done.result.reason}", err=True)
        raise SystemExit(1)
    res = done.outcome
    assert res is not None
    state = {True: "sleeping", False: "awake", None: "unknown"}[res.sleeping]
    what = f"asleep (level {level})" if action == "sleep" else "awake"
    click.echo(f"{name}: {what} after {res.seconds:.3f} s (server says: {state}); recorded in session {done.session}")


@server.command()
@click.argument("name")
@click.option("--level", type=click.IntRange(0, 2), default=1, show_default=True,
              help="0: scheduling paused (vLLM 0.33+); 1: weights to host memory, KV cache dropped; 2: weights "
                   "and KV cache dropped.")
@click.option("--url", default=None, help="The server's http://HOST:PORT (default: from its [[servers]] entry).")
@db_option
@pass_config
def sleep(cfg: Config, name: str, level: int, url: str | None, db: str | None) -> None:
    """Put vLLM server NAME to sleep (frees its GPU memory) and print how long it took."""
    _run(cfg, name, "sleep", level, url, db)


@server.command()
@click.argument("name")
@click.option("--url", default=None, help="The server's http://HOST:PORT (default: from its [[servers]] entry).")
@db_option
@pass_config
def wake(cfg: Config, name: str, url: str | None, db: str | None) -> None:
    """Wake vLLM server NAME and print how long it took (the model-switch time)."""
    _run(cfg, name, "wake", 1, url, db)
