"""`gpudash server sleep|wake NAME`: vLLM sleep mode from the command line, timed and recorded.

The server runs under `gpudash launch` / `serve` (or anything else); this command reaches it over HTTP
at its configured `port` (or --url) and records the operation, with its duration, as an event in the
store, so model-switch times can be compared across runs (with and without the transfer engine).
"""

from __future__ import annotations

import time

import click

from gpudash.cli import Group
from gpudash.commands.common import db_option, db_path, pass_config, usage_error
from gpudash.config import Config


@click.group(cls=Group)
def server() -> None:
    """Act on one configured server."""


def _run(cfg: Config, name: str, action: str, level: int, url: str | None, db: str | None) -> None:
    from gpudash.launcher.health import url_host
    from gpudash.launcher.sleep import SleepError
    from gpudash.records import Event
    from gpudash.store import Store, StoreError

    specs = {s.name: s for s in cfg.servers}
    if name not in specs:
        usage_error(f"no server named {name!r} in the config; configured: {', '.join(specs) or 'none'}")
    spec = specs[name]
    from gpudash.launcher.kinds import kind_of

    if spec.kind is None:
        usage_error(f"server {name!r} is attached with no `kind`; sleep and wake need its kind: set kind in its "
                    "[[servers]] entry")
    kind = kind_of(spec)
    problem = kind.sleep_problem(spec, level if action == "sleep" else None)
    if problem:
        usage_error(f"server {name!r}: {problem}")
    if url is None:
        if spec.port is None:
            usage_error(f"server {name!r} has no fixed `port`, so its address is unknown here; pass "
                        "--url http://HOST:PORT or set `port` in its [[servers]] entry")
        url = f"http://{url_host(spec.host)}:{spec.port}"
    elif not url.startswith(("http://", "https://")):
        usage_error(f"--url '{url}' must start with http:// or https://, e.g. http://127.0.0.1:8000")
    try:  # opened before acting, so a bad store leaves the server untouched
        store = Store.open(db_path(cfg, db))
    except StoreError as err:
        usage_error(str(err))
    sid = store.begin_session("cli", cfg, note=f"gpudash server {action} {name}")
    try:
        try:
            res = kind.sleep(url.rstrip("/"), level) if action == "sleep" else kind.wake(url.rstrip("/"))
        except SleepError as err:
            store.record_event(sid, Event(ts=time.time(), actor="cli", kind=f"server.{action}", target=name,
                                          ok=False, reason=str(err)))
            click.echo(f"gpudash: server {name!r}: {err}", err=True)
            raise SystemExit(1) from None
        state = {True: "sleeping", False: "awake", None: "unknown"}[res.sleeping]
        store.record_event(sid, Event(ts=time.time(), actor="cli", kind=f"server.{action}", target=name,
                                      new={"state": state, "seconds": round(res.seconds, 4), "level": res.level}))
    finally:
        store.end_session(sid)
        store.close()
    what = f"asleep (level {level})" if action == "sleep" else "awake"
    click.echo(f"{name}: {what} after {res.seconds:.3f} s (server says: {state}); recorded in session {sid}")


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
