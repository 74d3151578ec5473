"""One value that is not JSON, in a tick's errors or an event's `new`, leaves the rest of the session
replayable: that tick replays with an error naming the table and row, the event keeps the text as it is,
and a warning names table, session, tick and column. The real replay feed over a real SQLite file."""

from __future__ import annotations

import logging
from pathlib import Path

from gpudash.config import Config
from gpudash.records import Event
from gpudash.runtime.replay import ReplayFeed
from gpudash.store import Store


def test_a_session_with_non_json_values_still_replays(tmp_path: Path, caplog) -> None:
    path = tmp_path / "g.db"
    with Store.open(path) as store:
        sid = store.begin_session("sim:h200", Config())
        for i in range(3):
            store.record_event(sid, Event(ts=1_700_000_000.0 + i, actor="cli", kind="engine.knob", target="x", new=i))
        store.end_session(sid)
        store.db.execute("UPDATE ticks SET errors = 'not json {' WHERE session_id = ? AND tick = 1", [sid])
        store.db.execute("UPDATE events SET new = '{broken' WHERE session_id = ? AND tick = 2", [sid])
        store.db.conn.commit()
    with caplog.at_level(logging.WARNING):
        snaps = ReplayFeed(path, "latest").start(lambda *_: None).snapshots
    assert [s.tick for s in snaps] == [0, 1, 2]
    assert snaps[1].errors == (f"ticks row (session {sid}, tick 1): errors holds not json {{, not a JSON list of "
                               "texts",)
    assert snaps[2].events[0].new == "{broken" and snaps[0].events[0].new == 0
    assert f"events row (session {sid}, tick 2): new is not JSON" in caplog.text
