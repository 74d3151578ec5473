"""`gpudash serve`: start the configured servers (or the embedded demo), probe and record them, headless.

Servers start one after another, each once the previous is healthy; while they run, every tick (GPU,
host, server /metrics, probe requests, supervisor events) goes into SQLite. Ctrl-C, SIGTERM or SIGHUP stops
the probe, then every server (no process left behind), then closes the session. A server that cannot start
ends the command with one sentence and exit code 2, after stopping the ones already started.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

import click

from gpudash.commands.common import db_option, db_path, get_config, resolve_rig, sim_options, usage_error
from gpudash.commands.output import echo_fitted
from gpudash.outside import printable
from gpudash.records import RequestSample, Snapshot

if TYPE_CHECKING:
    from gpudash.runtime.stack import LaunchStack

STATUS_EVERY_S = 10.0
RECENT_REQUESTS = 200


class _Requests:
    """Sink keeping the newest probe requests, for the status line's TTFT and correlation."""

    def __init__(self) -> None:
        self.recent: deque[RequestSample] = deque(maxlen=RECENT_REQUESTS)
        self.total = 0
        self.failed = 0

    def __call__(self, snap: Snapshot) -> None:
        self.recent.extend(snap.requests)
        self.total += len(snap.requests)
        self.failed += sum(1 for r in snap.requests if not r.ok)


@click.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML config file with [[servers]] (default: gpudash --config, else the user config).")
@db_option
@sim_options
@click.option("--prometheus", "listen", metavar="[HOST:]PORT", default=None,
              help="Serve live values, the servers' among them, for Prometheus here (host defaults to 127.0.0.1; "
                   "default: [prometheus] listen).")
@click.option("--quiet", is_flag=True, default=False, help="No status lines.")
@click.pass_context
def serve(ctx: click.Context, config_file: str | None, db: str | None, sim: str | None, no_sim: bool,
          listen: str | None, quiet: bool) -> None:
    """Start and supervise the configured inference servers (or a demo one), probe and record them."""
    from gpudash.launcher.errors import LaunchError
    from gpudash.runtime.run import Run, check_store
    from gpudash.runtime.signals import StopSignals
    from gpudash.runtime.stack import default_log_dir
    from gpudash.store import StoreError
    from gpudash.telemetry.prometheus import StoreSize, open_sink

    if config_file is not None:
        ctx.find_root().obj["config_path"] = config_file
    cfg = get_config(ctx)
    rig = resolve_rig(cfg, sim, no_sim, quiet=quiet)
    path = db_path(cfg, db)
    try:
        check_store(path)
    except StoreError as err:
        usage_error(str(err))
    prom = None
    if listen or cfg.prometheus.listen:
        try:
            prom = open_sink(listen or cfg.prometheus.listen or "", StoreSize(path, cfg.store.max_bytes), cfg)
        except ValueError as err:
            usage_error(str(err))
    try:
        run = Run(cfg, rig, path, note="gpudash serve", servers=True, log_dir=default_log_dir())
    except OSError as err:
        if prom is not None:
            prom.close()
        usage_error(f"cannot write the demo model ({err}); check the user cache directory is writable")
    stack = run.stack
    assert stack is not None
    requests = _Requests()
    stop = threading.Event()
    failure: str | None = None
    try:
        # No engine started: a sim rig's source brings (and closes) its own; serve records servers, not
        # engine paths.
        with StopSignals(stop.set) as signals:
            run.start([requests, *([prom] if prom else [])])
            writer, sid = run.session.recording.writer, run.session.recording.session_id
            assert writer is not None and sid is not None
            if not quiet:
                what = "the demo server (no [[servers]] configured)" if stack.demo else f"{len(stack.specs)} server(s)"
                say(f"gpudash serve: session {sid} [{rig.label}] into {path}; starting {what}")
                if prom is not None:
                    say(f"gpudash serve: Prometheus metrics at {metrics_url(prom.host, prom.port)}")
            try:
                with signals.interrupting():  # while servers load, a signal unwinds the start
                    run.start_servers()
            except LaunchError as err:
                failure = str(err)
            except KeyboardInterrupt:
                stop.set()
                say("gpudash serve: interrupted while starting; stopping what was started")
            if failure is None and not stop.is_set():
                if not quiet:
                    for name in stack.supervisor.specs():
                        if name in stack.waiting:
                            click.echo(f"gpudash serve: {name} starts once the llama-server being built in the "
                                       f"background is ready", err=True)
                            continue
                        log = stack.supervisor.log_path(name)
                        say(f"gpudash serve: {name} {'ready' if log else 'attached'} at {stack.supervisor.base_url(name)}"
                            + (f" (log {log})" if log else ""))
                while not stop.wait(STATUS_EVERY_S) and writer.error is None:
                    if not quiet:
                        _status(stack, requests)
    finally:
        try:
            run.close(last_tick=True)  # servers first; the last tick records their stop events and states
        except StoreError as err:
            failure = failure or f"{err}; session {run.session.recording.session_id} holds the rows written before it"
        if prom is not None:
            prom.close()
    if failure is not None:
        usage_error(failure)
    if not quiet:
        say(f"gpudash serve: stopped all servers; session {sid} closed ({writer.rows_written} rows)")


def _status(stack: LaunchStack, requests: _Requests) -> None:
    from gpudash.launcher.probe.correlation import summarize

    states = ", ".join(f"{s.server} {s.state}" + (f" ({s.restarts} restarts)" if s.restarts else "")
                       for s in stack.supervisor.states())
    line = f"gpudash serve: {states}"
    for b in stack.build.poll()["builds"] if stack.build is not None else ():
        line += f"; building llama-server ({b.what}): {b.step}" + (f" {b.done}/{b.total}" if b.total else "")
    if requests.recent:
        s = summarize(list(requests.recent))
        c = s.correlation
        hit = "n/a" if s.hit_ttft_median_ms is None else f"{s.hit_ttft_median_ms:.0f} ms"
        miss = "n/a" if s.miss_ttft_median_ms is None else f"{s.miss_ttft_median_ms:.0f} ms"
        pearson = "n/a" if c.pearson is None else f"{c.pearson:+.2f}"
        failed = f" ({requests.failed} failed, last: {printable(s.last_error)})" if requests.failed and s.last_error else \
            f" ({requests.failed} failed)" if requests.failed else ""
        line += (f"; probe {requests.total} requests{failed}, TTFT median hits {hit} / misses {miss}, "
                 f"TTFT~hit Pearson {pearson}")
    say(line)


def say(line: str) -> None:
    """A status line on stderr, wrapped to the terminal (piped: one line, for grep and log files)."""
    echo_fitted([line], "    ", err=True)


def metrics_url(host: str, port: int) -> str:
    """Where Prometheus scrapes the exporter: http://127.0.0.1:9400/metrics ([::1] for an IPv6 host)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
