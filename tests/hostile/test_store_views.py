"""A database is gpudash's only if its tables are tables: a recording whose `sessions` is a view that
recurses for ever is refused in one sentence by `history`, `export` and `replay` (it hung them), and every
statement read from a handed file has a deadline (SQLite's progress handler). Real SQLite files, the real
CLI."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.store import Store
from hostile_helpers import WAIT_S, gpudash

FOREVER = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "


def _recording(tmp: Path) -> Path:
    path = tmp / "g.db"
    with Store.open(path) as store:
        store.end_session(store.begin_session("sim:h200", Config()))
    return path


@pytest.mark.parametrize("command", [["history"], ["export", "latest", "--format", "csv", "--out", "out"],
                                     ["replay", "latest"]])
def test_a_sessions_view_that_recurses_for_ever_is_refused(tmp_path: Path, command: list[str]) -> None:
    path = _recording(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE sessions RENAME TO sessions_kept")
        db.execute(f"CREATE VIEW sessions AS {FOREVER}SELECT s.* FROM sessions_kept s, r")
    try:
        r = gpudash(*command, "--db", str(path), home=tmp_path, cwd=tmp_path, timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gpudash {command[0]} still ran after {WAIT_S} s on a recursive view")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{path} holds a view named 'sessions'" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


def test_a_trigger_in_a_recording_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    path = _recording(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TRIGGER t AFTER INSERT ON ticks BEGIN DELETE FROM sessions; END")
    r = gpudash("record", "--sim", "h200", "--duration", "0.3", "--quiet", "--db", str(path), home=tmp_path,
                timeout=WAIT_S)
    assert r.returncode == 2 and "holds a trigger named 't'" in r.stderr, r.stderr[-2000:]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1


def test_a_read_that_never_yields_a_row_is_interrupted(tmp_path: Path) -> None:
    with Store.open(_recording(tmp_path), writing=False) as store:
        store.db.conn.arm(0.5)  # the reader's deadline (60 s), shortened for the test
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            store.db.execute(f"{FOREVER}SELECT count(*) FROM r").fetchone()
