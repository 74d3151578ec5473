"""Prune gives the space back: after a size-capped prune of a real SQLite file the file itself (not only
its data) is within `max_bytes`, and the pages go back in bounded steps with writers let in between."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gpudash.config import Config
from gpudash.store import Store
from gpudash.store.retention import Retention, data_bytes, prune

NOW = 1_800_000_000.0
DAY = 86400.0
MB = 1 << 20


def _filled(path: Path, mb: int) -> Store:
    """A new store (incremental auto-vacuum) with `mb` MB of ticks, all ten days old."""
    store = Store.open(path)
    sid = store.begin_session("sim:h200", Config())
    note = json.dumps(["x" * 1000])
    with store.db.conn:
        store.db.conn.executemany("INSERT INTO ticks (session_id, tick, ts, errors) VALUES (?, ?, ?, ?)",
                                  [(sid, t, NOW - 10 * DAY + t, note) for t in range(mb * 1000)])
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store


def _on_disk(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def test_a_size_capped_prune_shrinks_the_file_itself(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    store = _filled(db, 24)
    assert _on_disk(db) > 20 * MB
    cap = 4 * MB
    report = prune(store.db, Retention(raw_s=None, max_bytes=cap), now=NOW)
    assert report.bytes_after <= cap and data_bytes(store.db) <= cap
    assert store.db.execute("PRAGMA freelist_count").fetchone()[0] == 0
    assert _on_disk(db) <= cap, f"the file stayed at {_on_disk(db) / MB:.1f} MB after pruning to {cap / MB:.0f} MB"
    store.close()


def test_pages_go_back_in_steps_with_a_writer_let_in_between(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    store = _filled(db, 24)
    other = sqlite3.connect(db, timeout=0)  # a writer that never waits: it needs the lock to be free
    other.execute("CREATE TABLE IF NOT EXISTS beside (n INTEGER)")
    other.commit()
    writes = []

    def between() -> None:
        with other:
            other.execute("INSERT INTO beside VALUES (?)", [len(writes)])
        writes.append(len(writes))

    prune(store.db, Retention(raw_s=None, max_bytes=4 * MB), now=NOW, between=between)
    assert len(writes) >= 4, f"{len(writes)} steps for about 20 MB of free pages"
    assert other.execute("SELECT count(*) FROM beside").fetchone()[0] == len(writes)
    other.close()
    store.close()
