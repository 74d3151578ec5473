"""Where the app's snapshots come from: a live rig (a Session's wiring + servers + controller) or a
recorded session. The app gets one of these by injection and calls `start` in a worker after its first
frame, so nothing here runs on the UI thread. No textual imports: these are plain objects with threads.
"""

from __future__ import annotations

import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from gpudash.config import Config, ServerSpec, validate
from gpudash.records import Snapshot
from gpudash.rig import Rig, rig_of
from gpudash.session import Session

if TYPE_CHECKING:
    from gpudash.engine import TransferEngine
    from gpudash.control import Controller
    from gpudash.launcher.stack import LaunchStack

Deliver = Callable[[Snapshot], None]


@dataclass
class FeedInfo:
    """What the header and views need to know about a started feed."""

    source: str
    db_path: str | None
    recording: bool
    controller: Controller | None = None  # live feeds; None in replay
    specs: dict[str, ServerSpec] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)  # replay: the whole session, in tick order
    notes: list[str] = field(default_factory=list)  # what is missing and why (shown once)
    rig: str = ""  # the rig's stored label ("nvml", "sim:<profile>"); unset: the source is the label

    def __post_init__(self) -> None:
        self.rig = self.rig or self.source


class Feed(Protocol):
    source: str

    def start(self, deliver: Deliver) -> FeedInfo:
        """Begin delivering snapshots (blocking; the app calls it from a worker after its first frame)."""

    def start_servers(self) -> list[str]:
        """Launch what the feed supervises, after the views are live; returns problems to show."""

    def close(self) -> None: ...


class LiveFeed:
    """A running rig: the session's wiring (engine, pools, sources, sampler, recording) plus what the
    dashboard adds to it: the servers (LaunchStack), their inbox and the controller."""

    def __init__(self, config: Config, rig: Rig | str, db_path: Path, record: bool,
                 log_dir: Path | None = None) -> None:
        self.config, self.rig, self.db_path, self.record = config, rig_of(rig), db_path, record
        self.source = self.rig.label
        self.log_dir = log_dir
        self.session: Session | None = None
        self.stack: LaunchStack | None = None
        self.controller: Controller | None = None
        self.notes: list[str] = []
        self._life = threading.Lock()
        self._closing = False

    @property
    def engine(self) -> TransferEngine | None:
        return self.session.engine if self.session is not None else None

    def start(self, deliver: Deliver) -> FeedInfo:
        with self._life:  # a quit during start-up waits for it, then stops everything it started
            if self._closing:
                raise RuntimeError("gpudash is quitting")
            return self._start(deliver)

    def _start(self, deliver: Deliver) -> FeedInfo:
        from gpudash.control import Controller
        from gpudash.launcher.stack import LaunchStack
        from gpudash.preload.knobs import PreloadKnobs
        from gpudash.telemetry.inbox import Inbox

        session = self.session = Session(self.rig, self.config, self.db_path)
        inbox = Inbox()
        session.start_engine(live=True)
        session.make_pools()
        self.notes.extend(session.notes)
        from gpudash.launcher.discovery import nvml_gpu_pids

        self.stack = LaunchStack(self.config, inbox, self.log_dir, gpu_memory=self.rig.gpu_memory_totals,
                                 gpu_pids=None if self.rig.is_sim else nvml_gpu_pids)
        self.notes.extend(self.stack.notes())
        supervisor = self.stack.supervisor
        sampler = session.wire([deliver], inbox=inbox, pids=supervisor.pids, sample_pools=True,
                               extra_sources=self.stack.sources)
        if self.record:
            session.recording.set(True)
        self.controller = Controller(engine=session.engine, supervisor=supervisor, inbox=inbox,
                                     recorder=session.recording, pools=session.all_pools,
                                     preload=PreloadKnobs(inbox, supervisor.pids,
                                                          remember=supervisor.preload_knobs.update))
        sampler.start()
        return FeedInfo(self.source, str(self.db_path), session.recording.on, self.controller,
                        self.controller.specs(), self.controller.knobs(), notes=list(self.notes))

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
            stack, self.stack = self.stack, None
            session, self.session = self.session, None
            if stack is not None:
                stack.close()  # first: the servers' stop events reach the inbox, and the session below
            if session is not None:
                session.close()


class ReplayFeed:
    """A recorded session, loaded off the UI thread; the app's player paces it."""

    def __init__(self, db_path: Path, session: str) -> None:
        self.db_path, self.session = db_path, session
        self.source = f"replay:{session}"

    def start(self, deliver: Deliver) -> FeedInfo:
        from gpudash.store import Store

        with Store.open(self.db_path, writing=False) as store:
            sid = store.resolve_session(self.session)
            row = store.session_row(sid)
            snaps = list(store.snapshots(sid))
        self.source = f"replay:{sid} ({row['source']})"
        specs, knobs = _session_settings(row.get("config"))
        return FeedInfo(self.source, str(self.db_path), False, None, specs, knobs, snaps, rig=row["source"])

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
