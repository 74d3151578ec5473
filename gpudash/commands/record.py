"""`gpudash record`: headless recording of every tick into SQLite, optionally served to Prometheus.

Runs until the duration ends or SIGINT/SIGTERM/SIGHUP arrives; either way the sampler stops, the writer
flushes, and the session row gets its end time. Everything that can fail because of the user's input
(port taken, DB unusable, bad --prometheus) is checked before the session starts, so a refused run
leaves nothing behind.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

from gpudash import fmt
from gpudash.commands.common import db_option, db_path, pass_config, resolve_rig, sim_options, usage_error
from gpudash.commands.output import echo_fitted
from gpudash.config import Config
from gpudash.outside import printable
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


def _start_prometheus(listen: str | None, cfg: Config, db: Path) -> Any:
    if not listen:
        return None
    from gpudash.telemetry.prometheus import StoreSize, open_sink

    try:
        return open_sink(listen, StoreSize(db, cfg.store.max_bytes), cfg)
    except ValueError as err:
        usage_error(str(err))


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
    from gpudash.runtime.run import Run, check_store
    from gpudash.runtime.signals import StopSignals
    from gpudash.store import StoreError

    rig = resolve_rig(cfg, sim, no_sim)
    path = db_path(cfg, db)
    progress = _Progress()
    stop = threading.Event()
    # From the start, so a signal during start-up also ends in a closed session. SIGHUP (a dropped ssh) is a
    # stop like SIGTERM; the terminal it came from is gone, so output to it goes nowhere.
    with StopSignals(stop.set), ExitStack() as running:
        prom = _start_prometheus(listen or cfg.prometheus.listen, cfg, path)
        if prom:
            running.callback(prom.close)
        try:
            check_store(path)
        except StoreError as err:
            usage_error(str(err))
        run = Run(cfg, rig, path, note="gpudash record")
        running.callback(run.close)
        try:  # a sim rig's engine; none on real GPUs (see runtime/session.py)
            sampler = run.start([progress] + ([prom] if prom else []), interval_s=interval)
        except Exception as err:  # a driver, native library or engine that will not start: say which, stop
            raise click.ClickException(f"cannot start the {rig} telemetry sources: {type(err).__name__}: {err}") from None
        writer, sid = run.session.recording.writer, run.session.recording.session_id
        assert writer is not None and sid is not None
        if not quiet:
            where = f", Prometheus on {prom.host}:{prom.port}" if prom else ""
            echo_fitted([f"gpudash record: session {sid} [{rig}] every {sampler.interval_s:g} s into {path}{where}"],
                        "    ", err=True)
        started = time.monotonic()
        end = None if duration is None else started + duration
        next_status = started + STATUS_EVERY_S
        while not stop.is_set() and writer.error is None:
            now = time.monotonic()
            if end is not None and now >= end:
                break
            if now >= next_status:
                next_status += STATUS_EVERY_S
                if not quiet:
                    _status(sid, rig.label, progress, writer, now - started)
            stop.wait(min(next_status, end or next_status) - now)
        try:
            run.close()  # the sampler stops, the writer flushes, the session row gets its end time
        except StoreError as err:
            raise click.ClickException(f"{err}; session {sid} holds the rows written before it") from None
    if not quiet:
        echo_fitted([f"gpudash record: session {sid} closed: {progress.ticks} ticks, {writer.rows_written} rows "
                     f"in {fmt.duration(time.monotonic() - started)}"], "    ", err=True)


def _status(sid: int, source: str, p: _Progress, writer: Any, elapsed: float) -> None:
    sweep = f", last tick had errors: {printable(p.last.errors[0])}" if p.last and p.last.errors else ""
    echo_fitted([f"gpudash record: session {sid} [{source}] {fmt.duration(elapsed)}, {p.ticks} ticks, "
                 f"{p.gpu_rows} GPU rows, {writer.rows_written} rows on disk{sweep}"], "    ", err=True)
