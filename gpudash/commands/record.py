"""`gpudash record`: headless recording of every tick into SQLite, optionally served to Prometheus.

Runs until the duration ends or SIGINT/SIGTERM arrives; either way the sampler stops, the writer
flushes, and the session row gets its end time. Everything that can fail because of the user's input
(port taken, DB unusable, bad --prometheus) is checked before the session starts, so a refused run
leaves nothing behind.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import click

from gpudash.commands.common import db_option, db_path, pass_config, resolve_source, sim_options, usage_error
from gpudash.config import Config
from gpudash.records import Snapshot

STATUS_EVERY_S = 5.0


class _Progress:
    """A sink that remembers the newest tick and counts ticks and GPU rows for the status line."""

    def __init__(self) -> None:
        self.ticks = 0
        self.gpu_rows = 0
        self.errors = 0
        self.last: Snapshot | None = None

    def __call__(self, snap: Snapshot) -> None:
        self.ticks += 1
        self.gpu_rows += len(snap.gpus)
        self.errors += bool(snap.errors)
        self.last = snap


def _start_prometheus(listen: str | None) -> Any:
    if not listen:
        return None
    from gpudash.telemetry.prometheus import PrometheusSink, parse_listen

    try:
        host, port = parse_listen(listen)
    except ValueError as err:
        usage_error(str(err))
    try:
        return PrometheusSink(host, port)
    except OSError as err:
        usage_error(f"cannot serve Prometheus on {host}:{port} ({err.strerror}); pick another [HOST:]PORT for --prometheus")


@click.command()
@sim_options
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop after this many seconds (default: until Ctrl-C or SIGTERM).")
@click.option("--interval", type=click.FloatRange(min=0.01, max=3600), default=None,
              help="Seconds between ticks (default: [sampling] interval_s).")
@db_option
@click.option("--prometheus", "listen", metavar="[HOST:]PORT", default=None,
              help="Serve live values for Prometheus here (host defaults to 127.0.0.1; default: [prometheus] listen).")
@click.option("--quiet", is_flag=True, default=False, help="No status lines.")
@pass_config
def record(cfg: Config, sim: str | None, no_sim: bool, duration: float | None, interval: float | None,
           db: str | None, listen: str | None, quiet: bool) -> None:
    """Record telemetry to SQLite without a screen, until Ctrl-C, SIGTERM or --duration."""
    from gpudash.store import Store, StoreError, StoreWriter
    from gpudash.store.retention import Retention
    from gpudash.telemetry.factory import build_sources, sim_engine
    from gpudash.telemetry.sampler import Sampler

    source = resolve_source(cfg, sim, no_sim)
    interval = interval or cfg.sampling.interval_s
    path = db_path(cfg, db)
    prom = _start_prometheus(listen or cfg.prometheus.listen)
    try:
        store = Store.open(path)
    except StoreError as err:
        if prom:
            prom.close()
        usage_error(str(err))

    engine = None
    try:
        if source.startswith("sim:"):
            engine = sim_engine(source.removeprefix("sim:"), cfg)
        sources = build_sources(source, cfg, engine=engine)
    except Exception as err:  # a driver, native library or engine that will not start: say which, stop
        for opened in (engine, store, prom):
            if opened is not None:
                opened.close()
        raise click.ClickException(f"cannot start the {source} telemetry sources: {type(err).__name__}: {err}") from None
    sid = store.begin_session(source, cfg, note="gpudash record")
    writer = StoreWriter(path, sid, flush_interval_s=cfg.store.flush_interval_s, queue_max=cfg.store.queue_max,
                         retention=Retention.from_config(cfg.store))
    progress = _Progress()
    sinks = [writer.submit, progress] + ([prom] if prom else [])
    sampler = Sampler(sources, interval, source, sinks=sinks, source_timeout_s=cfg.sampling.source_timeout_s)

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    if not quiet:
        where = f", Prometheus on {prom.host}:{prom.port}" if prom else ""
        click.echo(f"gpudash record: session {sid} [{source}] every {interval:g} s into {path}{where}", err=True)
    started = time.monotonic()
    end = None if duration is None else started + duration
    next_status = started + STATUS_EVERY_S
    sampler.start()
    try:
        while not stop.is_set() and writer.error is None:
            now = time.monotonic()
            if end is not None and now >= end:
                break
            if now >= next_status:
                next_status += STATUS_EVERY_S
                if not quiet:
                    _status(sid, source, progress, writer, now - started)
            stop.wait(min(next_status, end or next_status) - now)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sampler.stop()
        failure = None
        try:
            writer.close()
        except StoreError as err:
            failure = err
        store.end_session(sid)
        store.close()
        if engine is not None:
            engine.close()
        if prom:
            prom.close()
    if failure is not None:
        raise click.ClickException(f"{failure}; session {sid} holds the rows written before it")
    if not quiet:
        click.echo(f"gpudash record: session {sid} closed: {progress.ticks} ticks, {writer.rows_written} rows "
                   f"in {time.monotonic() - started:.1f} s", err=True)


def _status(sid: int, source: str, p: _Progress, writer: Any, elapsed: float) -> None:
    sweep = f", last tick had errors: {p.last.errors[0]}" if p.last and p.last.errors else ""
    click.echo(f"gpudash record: session {sid} [{source}] {elapsed:.0f} s, {p.ticks} ticks, "
               f"{p.gpu_rows} GPU rows, {writer.rows_written} rows on disk{sweep}", err=True)
