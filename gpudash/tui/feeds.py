"""Where the app's snapshots come from: a live rig (sampler + engine + servers + recorder) or a recorded
session. The app gets one of these by injection and calls `start` in a worker after its first frame,
so nothing here runs on the UI thread. No textual imports: these are plain objects with threads.
"""

from __future__ import annotations

import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from gpudash.config import Config, ServerSpec, validate
from gpudash.records import Snapshot

Deliver = Callable[[Snapshot], None]


@dataclass
class FeedInfo:
    """What the header and views need to know about a started feed."""

    source: str
    db_path: str | None
    recording: bool
    controller: Any = None  # gpudash.control.Controller for live feeds; None in replay
    specs: dict[str, ServerSpec] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)  # replay: the whole session, in tick order
    notes: list[str] = field(default_factory=list)  # what is missing and why (shown once)


class Feed(Protocol):
    source: str

    def start(self, deliver: Deliver) -> FeedInfo:
        """Begin delivering snapshots (blocking; the app calls it from a worker after its first frame)."""

    def start_servers(self) -> list[str]:
        """Launch what the feed supervises, after the views are live; returns problems to show."""

    def close(self) -> None: ...


class Recorder:
    """Turns recording on and off by attaching the store writer to the sampler (SetRecording's target).

    The session is opened on first use and closed once, at `close`, so toggling never splits a run.
    """

    def __init__(self, db_path: Path, source: str, config: Config) -> None:
        self.db_path = db_path
        self._source, self._config = source, config
        self._sampler: Any = None
        self._store: Any = None
        self._writer: Any = None
        self.session_id: int | None = None
        self._on = False
        self._lock = threading.Lock()

    @property
    def on(self) -> bool:
        return self._on

    def attach(self, sampler: Any) -> None:
        self._sampler = sampler

    def set(self, on: bool) -> None:
        with self._lock:
            if on == self._on:
                return
            if on:
                self._ensure_writer()
                self._sampler.add_sink(self._writer.submit)
            else:
                self._sampler.remove_sink(self._writer.submit)
            self._on = on

    def _ensure_writer(self) -> None:
        if self._writer is not None:
            return
        from gpudash.store import Store, StoreWriter

        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self._store = Store.open(self.db_path)
        self.session_id = self._store.begin_session(self._source, self._config)
        sc = self._config.store
        self._writer = StoreWriter(self.db_path, self.session_id, flush_interval_s=sc.flush_interval_s,
                                   queue_max=sc.queue_max)

    def record_leftovers(self, drained: dict[str, tuple]) -> None:
        """Write what reached the inbox after the sampler stopped (e.g. the servers' stop events)."""
        if self._store is not None and self._on:
            for e in drained.get("events", ()):
                self._store.record_event(self.session_id, e)
            self._store.insert_requests(self.session_id, drained.get("requests", ()))

    def close(self) -> None:
        """Flush the writer and end the session (once)."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._store.end_session(self.session_id)
                self._store.close()
                self._writer = None


class LiveFeed:
    """A running rig: engine, inbox, sources, servers (LaunchStack), sampler, recorder, controller."""

    def __init__(self, config: Config, source: str, db_path: Path, record: bool, log_dir: Path | None = None) -> None:
        self.config, self.source, self.db_path, self.record = config, source, db_path, record
        self.log_dir = log_dir
        self.engine: Any = None
        self.inbox: Any = None
        self.stack: Any = None
        self.sampler: Any = None
        self.recorder: Recorder | None = None
        self.controller: Any = None
        self.notes: list[str] = []
        # Memory pools (engine.pools.MemoryPool by name) the app owns; sampled and resizable while running
        # together with the engine's own (all_pools); only these are closed here.
        self.pools: dict[str, Any] = {}
        self._life = threading.Lock()
        self._closing = False

    def _make_engine(self) -> Any:
        if self.source.startswith("sim:"):
            from gpudash.telemetry.factory import sim_engine

            return sim_engine(self.source.removeprefix("sim:"), self.config)
        from engine import EngineConfig, TransferEngine

        return TransferEngine(EngineConfig(**self.config.engine.model_dump(), backend="cuda"))

    def start(self, deliver: Deliver) -> FeedInfo:
        with self._life:  # a quit during start-up waits for it, then stops everything it started
            if self._closing:
                raise RuntimeError("gpudash is quitting")
            return self._start(deliver)

    def _start(self, deliver: Deliver) -> FeedInfo:
        from gpudash.control import Controller
        from gpudash.launcher.stack import LaunchStack
        from gpudash.preload import PreloadKnobs
        from gpudash.telemetry.factory import build_sources
        from gpudash.telemetry.inbox import Inbox
        from gpudash.telemetry.sampler import Sampler

        self.inbox = Inbox()
        try:
            self.engine = self._make_engine()
        except Exception as err:  # noqa: BLE001 - the dashboard still runs; the note says why there is no engine
            self.notes.append(f"transfer engine unavailable: {err}")
        pc = self.config.pools
        if self.engine is not None and pc.host_bytes and pc.device_bytes:
            from engine.pools import engine_pools

            try:
                self.pools.update(engine_pools(self.engine, host_bytes=pc.host_bytes, device_bytes=pc.device_bytes,
                                               shards=pc.shards))
            except Exception as err:  # noqa: BLE001 - e.g. not enough memory: say so, run without pools
                self.notes.append(f"memory pools not created: {err}")
        self.stack = LaunchStack(self.config, self.inbox, self.log_dir)
        supervisor = self.stack.supervisor
        sources = build_sources(self.source, self.config, inbox=self.inbox, engine=self.engine,
                                pids=supervisor.pids, pools=lambda: list(self.all_pools().values()))
        self.sampler = Sampler(sources + self.stack.sources, self.config.sampling.interval_s, self.source,
                               sinks=[deliver], source_timeout_s=self.config.sampling.source_timeout_s)
        self.recorder = Recorder(self.db_path, self.source, self.config)
        self.recorder.attach(self.sampler)
        if self.record:
            self.recorder.set(True)
        self.controller = Controller(engine=self.engine, supervisor=supervisor, inbox=self.inbox,
                                     recorder=self.recorder, pools=self.all_pools,
                                     preload=PreloadKnobs(self.inbox, supervisor.pids,
                                                          remember=supervisor.preload_knobs.update))
        self.sampler.start()
        return FeedInfo(self.source, str(self.db_path), self.recorder.on, self.controller,
                        self.controller.specs(), self.controller.knobs(), notes=list(self.notes))

    def all_pools(self) -> dict[str, Any]:
        """The pools gpudash made ([pools]) and the engine's own (its staging slots and relay buffers,
        `TransferEngine.pools()`), by name; a name shows once (gpudash's pool wins a clash)."""
        engine = self.engine
        out = dict(self.pools)
        for name, pool in (engine.pools() if engine is not None else {}).items():
            out.setdefault(name, pool)
        return out

    def start_servers(self) -> list[str]:
        """Start the servers one after another, health-gated (slow: the views are live meanwhile)."""
        stack = self.stack
        if stack is None or self._closing:
            return []
        try:
            stack.start()  # a quit meanwhile stops the servers (the supervisor cancels a pending start)
        except Exception as err:  # noqa: BLE001 - LaunchError names the server; the dashboard keeps running
            return [f"servers did not all start: {err}"]
        return []

    def close(self) -> None:
        """Stop what gpudash started, in order, and close the session cleanly (safe to call twice)."""
        self._closing = True
        with self._life:
            self._close()

    def _close(self) -> None:
        stack, self.stack = self.stack, None
        sampler, self.sampler = self.sampler, None
        recorder, self.recorder = self.recorder, None
        engine, self.engine = self.engine, None
        if stack is not None:
            stack.close()
        if sampler is not None:
            sampler.stop()
        if recorder is not None:
            if self.inbox is not None:
                recorder.record_leftovers(self.inbox.poll())
            recorder.close()
        pools, self.pools = self.pools, {}
        for pool in pools.values():  # before the engine that owns their memory
            pool.close()
        if engine is not None:
            engine.close()


class ReplayFeed:
    """A recorded session, loaded off the UI thread; the app's player paces it."""

    def __init__(self, db_path: Path, session: str) -> None:
        self.db_path, self.session = db_path, session
        self.source = f"replay:{session}"

    def start(self, deliver: Deliver) -> FeedInfo:
        from gpudash.store import Store

        store = Store.open(self.db_path)
        try:
            sid = store.resolve_session(self.session)
            row = store.session_row(sid)
            snaps = list(store.snapshots(sid))
        finally:
            store.close()
        self.source = f"replay:{sid} ({row['source']})"
        specs, knobs = _session_settings(row.get("config"))
        return FeedInfo(self.source, str(self.db_path), False, None, specs, knobs, snaps)

    def start_servers(self) -> list[str]:
        return []  # a replay starts nothing

    def close(self) -> None:
        pass


def _session_settings(text: str | None) -> tuple[dict[str, ServerSpec], dict[str, Any]]:
    """Server specs and engine knobs from the config the session recorded (replayed change events move
    them on from there), or nothing when the recorded config cannot be read."""
    if not text:
        return {}, {}
    try:
        cfg = validate(tomllib.loads(text))
    except Exception:  # noqa: BLE001 - an old or foreign config just means no split targets or knobs
        return {}, {}
    return {s.name: s for s in cfg.servers}, cfg.engine.model_dump()


class Player:
    """Replay position and pace: pause, step, seek and speed over a list of snapshots."""

    SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)

    def __init__(self, snaps: list[Snapshot], speed: float = 1.0) -> None:
        self.snaps = snaps
        self.index = -1  # last shown tick
        self.speed = speed
        self.paused = False

    @property
    def done(self) -> bool:
        return self.index >= len(self.snaps) - 1

    def delay_to_next(self) -> float:
        """Seconds of wall time until the next tick at the current speed (recorded gaps, scaled)."""
        if self.index < 0 or self.done:
            return 0.0
        gap = self.snaps[self.index + 1].ts - self.snaps[self.index].ts
        return max(0.0, min(gap, 10.0)) / self.speed

    def step(self) -> Snapshot | None:
        if self.done:
            return None
        self.index += 1
        return self.snaps[self.index]

    def seek(self, index: int) -> int:
        self.index = max(0, min(index, len(self.snaps) - 1))
        return self.index

    def faster(self, up: bool) -> float:
        i = min(range(len(self.SPEEDS)), key=lambda j: abs(self.SPEEDS[j] - self.speed))
        self.speed = self.SPEEDS[max(0, min(len(self.SPEEDS) - 1, i + (1 if up else -1)))]
        return self.speed
