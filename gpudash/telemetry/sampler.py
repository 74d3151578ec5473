"""The sampler: one thread that polls every source, builds one frozen Snapshot per tick and hands it to
every sink (store writer, TUI, Prometheus).

The next tick is scheduled when the previous one ends, so ticks never overlap or pile up. Each source
polls on its own worker thread; the tick waits at most `source_timeout_s` for them. A source that is
slower than that, or raises, contributes nothing that tick (its fields stay NA) and the reason goes
into `Snapshot.errors`; while its late poll is still running it is skipped rather than queued again.
A sink that raises is logged and the others still get the snapshot.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from dataclasses import fields as dataclass_fields, replace
from typing import Any, Protocol

from gpudash.records import HostSample, Snapshot

log = logging.getLogger(__name__)

Sink = Callable[[Snapshot], None]
# Computes more Snapshot fields from the tick's merged one, before any sink sees it (server_energy.py).
Deriver = Callable[[Snapshot], dict[str, Any]]
# The Snapshot fields sources fill with records, concatenated over sources (not the tick's own fields).
TUPLE_FIELDS = frozenset(f.name for f in dataclass_fields(Snapshot)) - {"ts", "tick", "source", "host", "errors"}


class Source(Protocol):
    """Anything the sampler polls. `poll` returns Snapshot field names mapped to tuples of records
    ("host" maps to one HostSample); an optional "errors" tuple of strings is passed through."""

    name: str

    def poll(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class _Worker:
    """One source on its own daemon thread, with at most one poll outstanding. Daemon, so a source
    hung in a driver call cannot keep the process from exiting after `Sampler.stop`."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.name = source.name
        self.pending: Future | None = None
        self._requests: queue.SimpleQueue[Future | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"gpudash-source-{source.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (fut := self._requests.get()) is not None:
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self.source.poll())
            except BaseException as err:  # handed to the tick, which reports it in Snapshot.errors
                fut.set_exception(err)

    def submit(self) -> Future | None:
        """Start a poll, or None when the previous one has not returned yet."""
        if self.pending is not None and not self.pending.done():
            return None
        self.pending = Future()
        self._requests.put(self.pending)
        return self.pending

    def close(self, grace_s: float) -> None:
        if self.pending is not None:
            wait([self.pending], timeout=grace_s)
        self._requests.put(None)
        try:
            self.source.close()
        except Exception:
            log.exception("closing telemetry source %s failed", self.name)


def _merge(fields: dict[str, Any], errors: list[str], name: str, result: Any) -> None:
    if not isinstance(result, dict):
        errors.append(f"{name}: poll returned {type(result).__name__}, expected a dict of fields")
        return
    for key, value in result.items():
        if key == "errors":
            errors.extend(str(e) for e in value)
        elif key == "host":
            if not isinstance(value, HostSample):
                errors.append(f"{name}: 'host' must be a HostSample, got {type(value).__name__}")
            else:
                fields["host"] = value
        elif key in TUPLE_FIELDS:
            fields[key] = fields.get(key, ()) + tuple(value)
        else:
            errors.append(f"{name}: unknown snapshot field {key!r} ignored")


class Sampler:
    """Drives the sources; see the module docstring for the scheduling rules."""

    def __init__(self, sources: list[Source], interval_s: float, source_label: str,
                 sinks: Iterable[Sink] = (), source_timeout_s: float = 0.5, derive: Iterable[Deriver] = ()) -> None:
        if interval_s <= 0 or source_timeout_s <= 0:
            raise ValueError("interval_s and source_timeout_s must be positive")
        self.source_label = source_label
        self.source_timeout_s = source_timeout_s
        self._interval = interval_s
        self._workers = [_Worker(s) for s in sources]
        self._derive = list(derive)
        self._sinks: list[Sink] = list(sinks)
        self._sinks_lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._closed = False
        self.tick = 0
        self.sink_failures = 0

    @property
    def interval_s(self) -> float:
        return self._interval

    def add_sink(self, sink: Sink) -> None:
        with self._sinks_lock:
            self._sinks.append(sink)

    def remove_sink(self, sink: Sink) -> None:
        with self._sinks_lock:
            if sink in self._sinks:
                self._sinks.remove(sink)

    def set_interval(self, s: float) -> None:
        """New gap between ticks; applies to the wait in progress."""
        if s <= 0:
            raise ValueError(f"sampling interval must be positive, got {s}")
        with self._cond:
            self._interval = s
            self._cond.notify_all()

    def poll_once(self) -> Snapshot:
        """One tick: poll every source, build the Snapshot, hand it to every sink, return it."""
        with self._tick_lock:
            ts = time.time()
            errors: list[str] = []
            futures: dict[_Worker, Future] = {}
            for w in self._workers:
                f = w.submit()
                if f is None:
                    errors.append(f"{w.name}: previous poll still running; its fields are NA this tick")
                else:
                    futures[w] = f
            wait(futures.values(), timeout=self.source_timeout_s)
            fields: dict[str, Any] = {}
            for w, f in futures.items():
                if not f.done():
                    errors.append(f"{w.name}: no answer within {self.source_timeout_s:g} s; "
                                  "its fields are NA this tick")
                elif (exc := f.exception()) is not None:
                    errors.append(f"{w.name}: {type(exc).__name__}: {exc}")
                else:
                    _merge(fields, errors, w.name, f.result())
            snap = Snapshot(ts=ts, tick=self.tick, source=self.source_label, errors=tuple(errors), **fields)
            for derive in self._derive:
                snap = replace(snap, **derive(snap))
            self.tick += 1
        self._deliver(snap)
        return snap

    def _deliver(self, snap: Snapshot) -> None:
        with self._sinks_lock:
            sinks = list(self._sinks)
        for sink in sinks:
            try:
                sink(snap)
            except Exception:
                self.sink_failures += 1
                log.exception("telemetry sink %r failed on tick %d", sink, snap.tick)

    def start(self) -> None:
        """Start the sampler thread (a daemon); the first tick runs at once."""
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._thread = threading.Thread(target=self._run, name="gpudash-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
            try:
                self.poll_once()
            except Exception:
                log.exception("sampler tick %d failed", self.tick)
            ended = time.monotonic()
            with self._cond:
                while not self._stopping and (left := ended + self._interval - time.monotonic()) > 0:
                    self._cond.wait(left)

    def stop(self) -> None:
        """Stop the thread (after the tick in progress), then close every source. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if not self._closed:
            self._closed = True
            for w in self._workers:
                w.close(self.source_timeout_s)
