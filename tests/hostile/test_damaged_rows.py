"""Text where a number belongs (SQLite allows `started = 'yesterday'`, and other tools write the file too):
`history` and `export` show the row as damaged and go on, never a traceback. Through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.store import Store
from hostile_helpers import gpudash


@pytest.fixture
def damaged_db(tmp_path: Path) -> Path:
    db = tmp_path / "g.db"
    with Store.open(db) as store:
        bad, good = store.begin_session("sim:h200", Config()), store.begin_session("sim:h200", Config())
        store.end_session(bad)
        store.end_session(good)
        store.db.execute("INSERT INTO ticks (session_id, tick, ts) VALUES (?, 0, 'noon')", [bad])
        store.db.execute("UPDATE sessions SET started = 'yesterday' WHERE id = ?", [bad])
        store.db.conn.commit()
    return db


def test_history_shows_a_damaged_session_and_the_others(damaged_db: Path, tmp_path: Path) -> None:
    r = gpudash("history", "--db", str(damaged_db), home=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert "damaged" in rows["1"] and "damaged" not in rows["2"]
    r = gpudash("history", "--json", "--db", str(damaged_db), home=tmp_path)
    assert r.returncode == 0, r.stderr
    first, second = json.loads(r.stdout)["sessions"]
    assert first["state"] == "damaged" and "started holds 'yesterday'" in first["damage"]
    assert second["state"] == "closed" and second["damage"] is None


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_export_writes_a_damaged_session(damaged_db: Path, tmp_path: Path, fmt: str) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow")  # parquet is an extra; the test extra installs it
    out = tmp_path / fmt
    r = gpudash("export", "1", "--db", str(damaged_db), "--format", fmt, "--out", str(out), home=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (out / f"sessions.{fmt}").exists() and (out / f"ticks.{fmt}").exists()
    if fmt == "parquet":
        assert "sessions row 1 is damaged: started holds 'yesterday'" in r.stderr
        assert "ticks row 0 is damaged: ts holds 'noon'" in r.stderr
