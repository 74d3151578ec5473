"""Issue 45 item 14: `replay latest` right after `bench engine` replays the recording, not the bench run
(which showed a blank Overview for 30 ticks), and `history` lists `server sleep` attempts apart from the
sessions, not as sessions of 0m00s. The real CLI on one SQLite file: a recording, a bench run, a sleep
attempt against a port where nothing listens."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudash.launcher.health import free_port
from gpudash.runtime.replay import recorded_session
from gpudash.store import Store, StoreError
from hostile_helpers import gpudash


def test_latest_is_the_recording_and_server_actions_are_listed_apart(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "v"\nkind = "vllm"\nmodel = "m"\nport = {free_port()}\n')
    record = gpudash("record", "--sim", "h200", "--duration", "0.5", "--quiet", "--db", str(db), home=tmp_path)
    assert record.returncode == 0, record.stderr
    bench = gpudash("bench", "engine", "--backend", "sim", "--profile", "h200", "--sizes", "1MiB", "--db", str(db),
                    home=tmp_path)
    assert bench.returncode == 0, bench.stderr
    gpudash("--config", str(cfg), "server", "sleep", "v", "--db", str(db), home=tmp_path)  # fails: nothing listens
    with Store.open(db, writing=False) as store:
        notes = {s.id: s.note for s in store.sessions()}
    assert list(notes.values())[:2] == ["gpudash record", "gpudash bench engine"] and len(notes) == 3, notes
    assert recorded_session(db, "latest") == 1
    r = gpudash("history", "--db", str(db), home=tmp_path)
    assert r.returncode == 0, r.stderr
    sessions, _, actions = r.stdout.partition("server actions")
    assert "gpudash server sleep v" not in sessions and "gpudash server sleep v" in actions, r.stdout


def test_latest_with_only_a_bench_run_says_there_is_no_recording(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    assert gpudash("bench", "engine", "--backend", "sim", "--profile", "h200", "--sizes", "1MiB", "--db", str(db),
                   home=tmp_path).returncode == 0
    with pytest.raises(StoreError, match="no recording of the dashboard to replay"):
        recorded_session(db, "latest")
    assert recorded_session(db, "1") == 1  # named by its id, a bench run still replays
