"""A recorded session as a feed: loaded off the UI thread, paced by the Player (pause, step, seek, speed),
with the server specs and engine knobs the session recorded, so the views show what they showed live."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from gpudash.config import ServerSpec, validate
from gpudash.records import Snapshot
from gpudash.runtime.feed import Deliver, FeedInfo
from gpudash.store import Store, StoreError


def recorded_session(path: Path, session: str) -> int:
    """The id of `session` (a number, or "latest": the newest recording of the dashboard, not a bench run or
    server action after it) in the recording at `path`; StoreError naming what is wrong (no such file, not
    a gpudash database, no such session)."""
    if not path.exists():
        raise StoreError(f"{path} does not exist; pass the recording's file with --db")
    with Store.open(path, writing=False) as store:
        return store.resolve_session(session, recording=True)


class ReplayFeed:
    """A recorded session, loaded off the UI thread; the app's player paces it."""

    def __init__(self, db_path: Path, session: str) -> None:
        self.db_path, self.session = db_path, session
        self.source = f"replay:{session}"

    def start(self, deliver: Deliver) -> FeedInfo:
        with Store.open(self.db_path, writing=False) as store:
            sid = store.resolve_session(self.session)
            row = store.session_row(sid)
            snaps = list(store.snapshots(sid))
        self.source = f"replay:{sid} ({row['source']})"
        specs, knobs = _session_settings(row.get("config"))
        return FeedInfo(self.source, str(self.db_path), False, None, specs, knobs, snaps, rig=row["source"])

    def start_servers(self) -> list[str]:
        return []  # a replay starts nothing

    def want_engine(self) -> list[str]:
        return []  # nor an engine

    def cpu_builds(self) -> dict[str, str]:
        return {}  # a replay changes nothing, so no split needs refusing

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
