"""One wiring for launch, record and serve: a Session on a sim rig makes the rig's engine, samples the rig through
it, records into a real SQLite session and stops everything in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.telemetry.rig import NvmlRig, SimulatedRig
from gpudash.runtime.session import Session
from gpudash.store import Store


def test_a_recorded_sim_session_ends_with_its_rows_and_closes_its_engine(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    ticks = []
    with Session(SimulatedRig("h200"), Config(), db, note="test") as session:
        session.start_engine(live=False)  # a sim rig always has its engine
        engine = session.engine
        assert engine is not None and engine.profile == "h200"
        sampler = session.wire([ticks.append], interval_s=0.05)
        session.recording.set(True)
        snap = sampler.poll_once()
        assert snap.source == "sim:h200" and snap.is_sim and snap.engine_paths  # the engine's paths are sampled
        sid = session.recording.session_id
    assert ticks and session.engine is None
    with pytest.raises(Exception, match="closed"):
        engine.stats()
    with Store.open(db) as store:
        row = store.session_row(sid)
        assert (row["source"], row["note"]) == ("sim:h200", "test") and row["ended"] is not None
        assert store.sessions()[-1].rows.get("gpu_samples", 0) >= 1


def test_close_with_a_last_tick_records_the_state_the_caller_just_left(tmp_path: Path) -> None:
    """serve stops its servers, then closes with last_tick: one more tick reaches the sinks and the store
    after the sampler's own ticks ended, carrying what the inbox got meanwhile (the servers' stop events)."""
    from gpudash.records import Event
    from gpudash.telemetry.inbox import Inbox

    db = tmp_path / "g.db"
    ticks = []
    inbox = Inbox()
    session = Session(SimulatedRig("h200"), Config(), db, note="serve")
    session.wire([ticks.append], inbox=inbox, interval_s=60)  # no engine started: the sim source brings its own
    session.recording.set(True)
    sid = session.recording.session_id
    inbox.push(Event(ts=1.0, actor="supervisor", kind="server.stop", target="tiny"))
    session.close(last_tick=True)
    assert len(ticks) == 1 and [e.kind for e in ticks[0].events] == ["server.stop"]
    with Store.open(db) as store:
        assert store.session_row(sid)["ended"] is not None
        assert store.count(sid, "gpu_samples") == 1  # the last tick's one sim GPU
        assert [e["kind"] for e in store.rows(sid, "events")] == ["server.stop"]


def test_a_headless_session_on_real_gpus_starts_no_engine(tmp_path: Path) -> None:
    session = Session(NvmlRig(), Config(), tmp_path / "g.db")
    session.start_engine(live=False)
    assert session.engine is None and session.notes == []
    session.close()


def test_a_live_engine_that_cannot_start_is_a_note(tmp_path: Path) -> None:
    class Broken(NvmlRig):
        def make_engine(self, config: Config):  # type: ignore[override]
            raise RuntimeError("no driver here")

    session = Session(Broken(), Config(), tmp_path / "g.db")
    session.start_engine(live=True)  # on real GPUs it is made on first need (tests/test_engine_on_demand.py)
    assert session.notes == []
    session.want_engine()
    assert session.notes == ["transfer engine unavailable: no driver here"]
    session.close()


def test_store_is_a_context_manager(tmp_path: Path) -> None:
    with Store.open(tmp_path / "g.db") as store:
        store.sessions()
    with pytest.raises(Exception, match="closed"):
        store.sessions()
