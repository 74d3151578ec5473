"""Records round-trip through a real SQLite file; sessions, migrations and bad files behave."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
import sqlite_utils

from gpudash.records import SAMPLE_TABLES, Event, RequestSample
from gpudash.store import SESSION_TABLES, Store, StoreError, StoreWriter
from gpudash.store.schema import SCHEMA_VERSION, current_version, migrate

from store_samples import SOURCE, full_snapshot


def test_every_table_round_trips_through_writer_and_snapshots(store, config, tmp_path) -> None:
    sid = store.begin_session(SOURCE, config)
    sent = [full_snapshot(t) for t in range(7)]
    writer = StoreWriter(store.path, sid, flush_interval_s=0.05)
    for s in sent:
        writer.submit(s)
    writer.close()
    got = list(store.snapshots(sid))
    assert got == sent  # every field of every record kind, bools, JSON values, NA (None) and errors
    for table in SAMPLE_TABLES:
        assert store.count(sid, table) > 0, f"{table} had no rows"


def test_session_row_and_history_counts(store, config) -> None:
    sid = store.begin_session(SOURCE, config, note="test")
    writer = StoreWriter(store.path, sid)
    for t in range(4):
        writer.submit(full_snapshot(t, n_gpus=2))
    writer.close()
    store.end_session(sid)
    (info,) = store.sessions()
    assert info.id == sid and info.source == SOURCE and info.note == "test" and info.ended is not None
    assert info.rows["gpu_samples"] == 8 and info.rows["ticks"] == 4 and info.rows["events"] == 8
    row = store.session_row(sid)
    assert "[engine]" in row["config"] and "h2d_chunk_bytes = 2810000" in row["config"]
    assert row["host"] and row["version"]


def test_resolve_session(store, config) -> None:
    with pytest.raises(StoreError, match="no sessions yet"):
        store.resolve_session("latest")
    a = store.begin_session(SOURCE, config)
    b = store.begin_session("nvml", config)
    assert store.resolve_session("latest") == b
    assert store.resolve_session(str(a)) == a
    with pytest.raises(ValueError, match="no session 99 .*gpudash history"):
        store.resolve_session("99")
    with pytest.raises(ValueError, match="a number or 'latest'"):
        store.resolve_session("yesterday")


def test_direct_writes_become_their_own_ticks(store, config) -> None:
    sid = store.begin_session("nvml", config)
    store.record_event(sid, Event(1.0, "cli", "engine.knob", "outstanding", 2, 3))
    store.insert_requests(sid, [RequestSample(2.0, "chat", 0.1, 0.2, 10, 5), RequestSample(2.5, "chat", 0.1, 0.2, 10, 0)])
    snaps = list(store.snapshots(sid))
    assert [s.tick for s in snaps] == [0, 1]
    assert snaps[0].events[0].new == 3 and len(snaps[1].requests) == 2 and snaps[1].ts == 2.5


def test_old_version_db_migrates_forward_and_backfills_ticks(tmp_path: Path, config) -> None:
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    assert migrate(db, target=1) == 1  # a DB as the first schema left it: no ticks table, no indices
    db["sessions"].insert({"id": 1, "started": 1.0, "source": "sim:h200"})
    db["gpu_samples"].insert_all([{"session_id": 1, "tick": t, "ts": 10.0 + t, "index": 0, "uuid": "u", "name": "H200"}
                                  for t in range(3)])
    db.close()
    store = Store.open(path)
    assert current_version(store.db) == SCHEMA_VERSION
    assert [r["tick"] for r in store.rows(1, "ticks")] == [0, 1, 2]
    assert [s.gpus[0].ts for s in store.snapshots(1)] == [10.0, 11.0, 12.0]
    indexed = {tuple(ix.columns) for ix in store.db["gpu_samples"].indexes}
    assert {("session_id", "tick"), ("session_id", "ts")} <= indexed
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()
    assert current_version(Store.open(path).db) == SCHEMA_VERSION  # reopening is a no-op


def test_newer_schema_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    Store.open(path).close()
    sqlite_utils.Database(path)["schema_version"].insert({"version": SCHEMA_VERSION + 1, "applied": 0.0})
    with pytest.raises(StoreError, match="newer gpudash .*upgrade gpudash or pass another --db"):
        Store.open(path)


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 100)
    with pytest.raises(StoreError, match="not a usable gpudash database"):
        Store.open(path)
    with pytest.raises(StoreError, match="is a directory"):
        Store.open(tmp_path)


def test_writer_flushes_on_its_interval_without_close(store, config) -> None:
    sid = store.begin_session(SOURCE, config)
    writer = StoreWriter(store.path, sid, flush_interval_s=0.1)
    writer.submit(full_snapshot(0))
    deadline = time.monotonic() + 5
    while store.count(sid, "gpu_samples") < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.count(sid, "gpu_samples") == 8  # visible to another connection before close
    writer.close()


def test_writer_back_pressure_blocks_producers_until_the_disk_frees(store, config) -> None:
    sid = store.begin_session(SOURCE, config)
    per_snap = 1 + 8 + 1 + 2 + 1 + 2 + 1 + 1 + 2 + 2  # tick + rows of full_snapshot(n_gpus=8)
    writer = StoreWriter(store.path, sid, flush_interval_s=0.05, queue_max=per_snap * 3)
    blocker = sqlite3.connect(store.path, timeout=0)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock: our flushes stall
    done = threading.Event()

    def produce() -> None:
        for t in range(20):
            writer.submit(full_snapshot(t))
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    assert not done.wait(0.5), "producer was never slowed although the writer could not flush"
    blocker.rollback()
    blocker.close()
    assert done.wait(10)
    thread.join()
    writer.close()
    assert store.count(sid, "ticks") == 20 and store.count(sid, "gpu_samples") == 160


def test_closed_writer_refuses_more(store, config) -> None:
    writer = StoreWriter(store.path, store.begin_session(SOURCE, config))
    writer.close()
    with pytest.raises(StoreError, match="closed"):
        writer.submit(full_snapshot(0))


def test_session_tables_cover_every_record_kind() -> None:
    assert set(SESSION_TABLES) == {"sessions", "ticks", *SAMPLE_TABLES}


def test_concurrent_opens_of_a_new_file_migrate_it_once(tmp_path: Path) -> None:
    def open_it(path: Path, barrier: threading.Barrier, errors: list[BaseException]) -> None:
        try:
            barrier.wait()
            Store.open(path).close()
        except BaseException as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    # 25 new files, four openers each: the switch to WAL once lost this race about one time in ten
    for n in range(25):
        path, barrier, errors = tmp_path / f"race{n}.db", threading.Barrier(4), []
        threads = [threading.Thread(target=open_it, args=(path, barrier, errors)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], (n, errors)
        db = sqlite_utils.Database(path)
        assert [v for (v,) in db.execute("SELECT version FROM schema_version ORDER BY version")] == \
            list(range(1, SCHEMA_VERSION + 1))
        db.close()


def test_a_failing_migration_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch) -> None:
    from gpudash.store import schema

    path = tmp_path / "half.db"
    db = sqlite_utils.Database(path)
    migrate(db, target=1)

    def broken(db: sqlite_utils.Database) -> None:
        db["ticks"].create({"x": int})
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(schema, "MIGRATIONS", [schema.MIGRATIONS[0], broken, *schema.MIGRATIONS[2:]])
    with pytest.raises(RuntimeError, match="disk on fire"):
        migrate(db)
    assert current_version(db) == 1 and "ticks" not in db.table_names()


def test_a_session_begins_while_another_process_writes(store, config, tmp_path) -> None:
    """sqlite_utils reads the sessions table before it inserts the new row: begun deferred, that failed with
    "database is locked" whenever the other writer (a recording gpudash) committed in between."""
    sid = store.begin_session("nvml", config)
    stop = threading.Event()

    def other_writer() -> None:  # a commit every millisecond (a writer that never lets go starves any other)
        other = sqlite3.connect(tmp_path / "g.db", timeout=10.0, isolation_level=None)
        while not stop.wait(0.001):
            other.execute("UPDATE sessions SET note = ? WHERE id = ?", [str(time.time()), sid])
        other.close()

    writer = threading.Thread(target=other_writer)
    writer.start()
    try:
        begun = [store.begin_session("sim:h200", config) for _ in range(20)]
    finally:
        stop.set()
        writer.join()
    assert len(set(begun)) == 20


def test_direct_write_waits_for_another_writer_instead_of_failing(store, config, tmp_path) -> None:
    """record_event reads the last tick, then writes. Begun deferred, it failed at once with "database
    is locked" whenever another connection committed in between (a stale WAL snapshot cannot become a
    write); begun IMMEDIATE, it waits for the other writer and then writes."""
    sid = store.begin_session("nvml", config)
    other = sqlite3.connect(tmp_path / "g.db", timeout=10.0, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE sessions SET note = 'busy' WHERE id = ?", [sid])
    threading.Timer(0.3, lambda: other.execute("COMMIT")).start()
    store.record_event(sid, Event(time.time(), "cli", "engine.knob", "engine", 1, 2))
    other.close()
    assert [r[0] for r in store.db.execute("SELECT kind FROM events WHERE session_id = ?", [sid])] == ["engine.knob"]
