"""Forward migrations on real files: a DB written at schema v5 (before pool_samples) opens at the current
version with every row kept, the same tables a new file has, and sessions that replay with NA slabs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from gpudash.records import PoolSample
from gpudash.store import Store, StoreWriter
from gpudash.store.export import export_session
from gpudash.store.schema import SCHEMA_VERSION, migrate

from store_samples import full_snapshot

V5_DUMP = Path(__file__).parent / "data" / "schema_v5.sql"


def v5_file(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.executescript(V5_DUMP.read_text())
    con.close()
    return path


def row_counts(path: Path) -> dict[str, int]:
    db = sqlite_utils.Database(path)
    return {t: db[t].count for t in db.table_names()}


def layout(path: Path) -> dict[str, tuple]:
    """Every table's columns (name, type, not null) and indices: what two files must share to be the same schema.
    Columns are compared by name: SQLite appends a column that a migration adds, while a new file lays the
    1-minute tier out with text columns first, so a record's new text field stands elsewhere in each."""
    db = sqlite_utils.Database(path)
    return {t: (tuple(sorted((c.name, c.type, c.notnull) for c in db[t].columns)),
                tuple(sorted(tuple(i.columns) for i in db[t].indexes)))
            for t in db.table_names() if t != "schema_version"}


def test_a_v5_file_keeps_every_row_and_gains_the_pool_tables(tmp_path: Path) -> None:
    path = v5_file(tmp_path / "v5.db")
    before = row_counts(path)
    assert before["schema_version"] == 5 and before["pool_shard_samples"] == 4 and before["pool_shard_samples_1m"] == 1
    Store.open(path).close()
    after = row_counts(path)
    assert {t: n for t, n in after.items() if t in before and t != "schema_version"} == \
        {t: n for t, n in before.items() if t != "schema_version"}
    assert after["schema_version"] == SCHEMA_VERSION == 7
    assert after["pool_samples"] == after["pool_samples_1m"] == 0  # v5 never read slabs
    Store.open(tmp_path / "new.db").close()
    assert layout(path) == layout(tmp_path / "new.db")


def test_an_old_session_replays_and_exports_without_slabs_beside_a_new_one_with_them(tmp_path: Path, config) -> None:
    store = Store.open(v5_file(tmp_path / "v5.db"))
    exported = {e.table: e.rows for e in export_session(store, 1, "csv", tmp_path / "out")}
    assert exported["pool_samples"] == 0 and exported["pool_shard_samples"] == 4
    assert (tmp_path / "out" / "pool_samples.csv").read_text() == "session_id,source,tick,ts,pool,slab,unassigned\n"
    old = list(store.snapshots(1))
    assert [s.tick for s in old] == list(range(8))
    assert all(s.pools == () for s in old)
    assert [(p.pool, p.shard, p.failures) for s in old[4:] for p in s.pool_shards] == \
        [("pinned", "numa0", t) for t in range(4, 8)]  # the raw shard rows are intact
    sid = store.begin_session("sim:8xh20", config)
    writer = StoreWriter(store.path, sid)
    sent = [full_snapshot(t, n_gpus=1) for t in range(3)]
    for snap in sent:
        writer.submit(snap)
    writer.close()
    got = list(store.snapshots(sid))
    store.close()
    assert got == sent and got[2].pools == (PoolSample(got[2].ts, "pinned", 2**31, 2**30 - 2 * 2**20),)


def test_a_file_stopped_at_any_earlier_version_reaches_the_current_schema(tmp_path: Path) -> None:
    """Steps 1-5 build only the tables they built when released, so v6 can add pool_samples after any of them."""
    Store.open(tmp_path / "new.db").close()
    for version in range(1, SCHEMA_VERSION):
        path = tmp_path / f"v{version}.db"
        db = sqlite_utils.Database(path)
        migrate(db, target=version)
        assert ("pool_samples" in db.table_names()) == (version >= 6)
        assert "server_energy_samples" not in db.table_names()
        assert migrate(db) == SCHEMA_VERSION
        db.close()
        assert layout(path) == layout(tmp_path / "new.db"), f"from v{version}"
