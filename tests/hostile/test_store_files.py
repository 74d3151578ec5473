"""The store and its exports against files that are not what gpudash wrote: another application's SQLite
database is left exactly as it was, a gpudash file another tool changed (a dropped column, a BLOB in a time
column) ends in one sentence or is exported as it is, a server's -Inf is valid JSON wherever it goes, and a
--db name holding `?` or `#` is the file it names. Through the real CLI and real SQLite files."""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpudash.config import Config
from gpudash.launcher.health import free_port
from gpudash.records import Event, ServerSample, ServerState, Snapshot
from gpudash.store import Store, StoreError, StoreWriter
from gpudash.store.export import export_session
from hostile_helpers import ENTRY, WAIT_S, cli_env, gpudash


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _strict(text: str) -> object:
    """JSON as a strict parser reads it: NaN, Infinity and -Infinity are errors."""
    def refuse(word: str) -> object:
        raise ValueError(f"{word} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def other_db(tmp_path: Path) -> Path:
    """An SQLite file of some other application: one table, one row, the default rollback journal."""
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE foo (x TEXT)")
        db.execute("INSERT INTO foo VALUES ('theirs')")
    return path


@pytest.mark.parametrize("command", [["record", "--sim", "h200", "--duration", "0.3", "--quiet"], ["history"],
                                     ["export", "latest", "--format", "csv", "--out", "out"]])
def test_another_applications_database_is_refused_and_left_as_it_was(other_db: Path, tmp_path: Path,
                                                                   command: list[str]) -> None:
    before = _digest(other_db)
    r = gpudash(*command, "--db", str(other_db), home=tmp_path, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "another application's SQLite database (tables foo)" in r.stderr
    assert _digest(other_db) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("other")) == ["other.db"]  # no -wal
    with sqlite3.connect(other_db) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["foo"]


def test_an_empty_sqlite_file_becomes_a_gpudash_store(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()  # a valid SQLite file with no tables (0 bytes until a table is made)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 1")  # now a non-empty file with a header and no tables
    assert path.stat().st_size > 0
    with Store.open(path) as store:
        assert store.sessions() == []


def _dropped_note(tmp_path: Path) -> Path:
    path = tmp_path / "g.db"
    with Store.open(path) as store:
        store.end_session(store.begin_session("sim:h200", Config()))
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE sessions DROP COLUMN note")
    return path


@pytest.mark.parametrize("command", [["history"], ["history", "--json"],
                                     ["record", "--sim", "h200", "--duration", "0.3", "--quiet"]])
def test_a_dropped_column_is_one_sentence(tmp_path: Path, command: list[str]) -> None:
    path = _dropped_note(tmp_path)
    r = gpudash(*command, "--db", str(path), home=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "lacks the column sessions.note" in r.stderr, r.stderr


def test_a_blob_in_a_time_column_is_exported_and_listed(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    with Store.open(path) as store:
        sid = store.begin_session("sim:h200", Config(), note="gpudash record")
        store.db.execute("UPDATE sessions SET ended = ?, note = ? WHERE id = ?", [b"\x00\xffend", b"a\xffnote", sid])
        store.db.conn.commit()
    out = tmp_path / "out"
    r = gpudash("export", "latest", "--db", str(path), "--format", "json", "--out", str(out), home=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    (row,) = _strict((out / "sessions.json").read_text())
    assert row["ended"] == b"\x00\xffend".hex()
    r = gpudash("history", "--json", "--db", str(path), home=tmp_path)
    assert r.returncode == 0, r.stderr
    (listed,) = _strict(r.stdout)["sessions"]
    assert listed["state"] == "damaged" and "ended holds" in listed["damage"] and listed["note"] == "a\ufffdnote"
    r = gpudash("history", "--db", str(path), home=tmp_path)
    assert r.returncode == 0 and "damaged" in r.stdout, r.stderr


def test_minus_infinity_is_valid_json_in_the_store_and_every_export(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    store = Store.open(path)
    sid = store.begin_session("sim:h200", Config())
    writer = StoreWriter(path, sid)
    server = ServerSample(ts=1.0, server="a", kind="vllm", state=ServerState.READY, tokens_per_s=-math.inf,
                          ttft_mean_s=math.nan, kv_cache_usage=math.inf)
    event = Event(ts=1.0, actor="supervisor", kind="server.budget", target="a", new={"ttft": -math.inf, "x": [math.nan]})
    writer.submit(Snapshot(ts=1.0, tick=0, source="sim:h200", servers=(server,), events=(event,)))
    writer.close()
    (stored,) = store.db.execute("SELECT new FROM events").fetchone()
    assert _strict(stored) == {"ttft": None, "x": [None]}
    files = export_session(store, sid, "json", tmp_path / "json")
    store.close()
    rows = {f.table: _strict(f.path.read_text()) for f in files}
    (s,) = rows["server_samples"]
    assert (s["tokens_per_s"], s["ttft_mean_s"], s["kv_cache_usage"]) == (None, None, None)
    assert json.loads(rows["events"][0]["new"]) == {"ttft": None, "x": [None]}


def test_a_db_name_with_a_question_mark_or_hash_is_the_file_it_names(tmp_path: Path) -> None:
    """The exporter's store size is read from the file --db names, not from `we` with a query or fragment."""
    db = tmp_path / "we?ird#name.db"
    port = free_port()
    proc = subprocess.Popen([sys.executable, *ENTRY, "record", "--sim", "h200", "--interval", "0.2", "--quiet",
                             "--duration", "120", "--db", str(db), "--prometheus", f"127.0.0.1:{port}"],
                            env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    size = None
    try:
        end = time.monotonic() + WAIT_S
        while time.monotonic() < end and proc.poll() is None:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError:
                text = ""
            lines = [ln for ln in text.splitlines() if ln.startswith("gpudash_store_data_bytes")]
            if lines:
                size = float(lines[0].split()[-1])
                break
            time.sleep(0.2)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err
    assert size is not None and size > 0, size
    stray = [p.name for p in tmp_path.iterdir() if p.name.startswith("we") and not p.name.startswith(db.name)]
    assert stray == []  # SQLite read the name up to `?` as the file before: it made an empty `we`


def test_store_open_refuses_in_one_sentence(other_db: Path) -> None:
    with pytest.raises(StoreError, match=r"^\S+ is another application's SQLite database \(tables foo\), not "
                                         r"gpudash's; gpudash leaves it as it is: pass another --db$"):
        Store.open(other_db, writing=False)
