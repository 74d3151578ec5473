"""Retention on a real SQLite file: old samples become 1-minute means and maxima, data past the retention
age or above the size cap goes, events and requests keep their ticks, and `gpudash store` drives it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.config import Config, StoreConfig
from gpudash.records import Event, GpuSample, HostSample, Snapshot
from gpudash.store import Store, StoreWriter
from gpudash.store.retention import Retention, data_bytes, prune
from gpudash.store.schema import rollup_schema

NOW = 1_800_000_000.0
DAY = 86400.0


def _fill(store: Store, start: float, seconds: int, every: float = 1.0, gpus: int = 2, sid: int | None = None) -> int:
    sid = sid if sid is not None else store.begin_session("sim:h200", Config())
    writer = StoreWriter(store.path, sid, flush_interval_s=0.5)
    for t in range(int(seconds / every)):
        ts = start + t * every
        writer.submit(Snapshot(ts, t, "sim:h200",
                               gpus=tuple(GpuSample(ts, i, f"u{i}", "H200", float(t % 60), 100 + t) for i in range(gpus)),
                               host=HostSample(ts, 10.0),
                               events=(Event(ts, "cli", "engine.knob", "outstanding", 2, 3),) if t == 5 else ()))
    writer.close()
    return sid


def test_old_samples_fold_into_minute_means_and_maxima(store: Store) -> None:
    sid = _fill(store, NOW - 2 * DAY, 180)  # three whole minutes, two days old
    report = prune(store.db, Retention(raw_s=DAY), now=NOW)
    assert report.rolled_rows == 180 * 3  # two GPUs and the host per tick
    assert store.count(sid, "gpu_samples") == 0
    rows = list(store.db.query("SELECT * FROM gpu_samples_1m WHERE [index] = 0 ORDER BY bucket"))
    assert [r["n"] for r in rows] == [60, 60, 60]
    assert [r["util_pct"] for r in rows] == [29.5] * 3 and [r["util_pct_max"] for r in rows] == [59.0] * 3
    assert rows[0]["mem_used_max"] == 159 and rows[0]["uuid"] == "u0"
    # the tick that carries an event stays (replay shows it); the others went with their samples
    assert [t["tick"] for t in store.rows(sid, "ticks")] == [5]
    assert store.count(sid, "events") == 1


def test_a_minute_keeps_one_row_per_gpu_with_every_throttle_reason_seen(store: Store) -> None:
    """Status text (a GPU's throttle reasons) does not split a GPU's minute: the row gathers the values."""
    sid = store.begin_session("sim:h200", Config())
    writer = StoreWriter(store.path, sid, flush_interval_s=0.5)
    start = NOW - 2 * DAY
    for t in range(60):
        ts = start + t
        reason = "none" if t < 40 else "power cap"
        writer.submit(Snapshot(ts, t, "sim:h200", gpus=(GpuSample(ts, 0, "u0", "H200", 50.0, 100, throttle=reason),)))
    writer.close()
    prune(store.db, Retention(raw_s=DAY), now=NOW)
    (row,) = store.db.query("SELECT * FROM gpu_samples_1m")
    assert row["n"] == 60 and row["util_pct"] == 50.0
    assert sorted(row["throttle"].split(",")) == ["none", "power cap"]


def test_a_minute_keeps_every_clock_event_flag_seen(store: Store) -> None:
    """NVML's clock-event reasons are a bitmask: the minute's row is the OR of its ticks' flags (a mean of
    1 and 4 would read 2.5, a flag never set), and a GPU that never reported one stays unknown."""
    sid = store.begin_session("sim:h200", Config())
    writer = StoreWriter(store.path, sid, flush_interval_s=0.5)
    start = NOW - 2 * DAY
    for t in range(60):
        ts = start + t
        flags = 0x1 if t < 30 else 0x4 if t < 50 else 0x0  # idle, then sw power cap, then clocks free
        writer.submit(Snapshot(ts, t, "sim:h200", gpus=(GpuSample(ts, 0, "u0", "H200", 50.0, 100, clock_events=flags),
                                                        GpuSample(ts, 1, "u1", "H200", 50.0, 100))))
    writer.close()
    prune(store.db, Retention(raw_s=DAY), now=NOW)
    rows = {r["index"]: r for r in store.db.query("SELECT * FROM gpu_samples_1m")}
    assert rows[0]["clock_events"] == 0x5 and rows[1]["clock_events"] is None
    assert "clock_events_max" not in rows[0]


def test_recent_samples_stay_raw(store: Store) -> None:
    sid = _fill(store, NOW - 600, 120)
    assert prune(store.db, Retention(raw_s=DAY), now=NOW).rolled_rows == 0
    assert store.count(sid, "gpu_samples") == 240


def test_retention_age_deletes_old_sessions_entirely(store: Store) -> None:
    old = _fill(store, NOW - 100 * DAY, 60)
    store.end_session(old)
    store.db.execute("UPDATE sessions SET started = ?, ended = ? WHERE id = ?", [NOW - 100 * DAY, NOW - 99 * DAY, old])
    store.db.conn.commit()
    new = _fill(store, NOW - 60, 60)
    report = prune(store.db, Retention(raw_s=DAY, retain_s=30 * DAY), now=NOW)
    assert report.deleted_sessions == 1
    assert [s.id for s in store.sessions()] == [new]
    assert store.count(new, "gpu_samples") == 120


def test_size_cap_deletes_the_oldest_first(store: Store) -> None:
    _fill(store, NOW - 3 * DAY, 3600, every=1.0, gpus=8)
    recent = _fill(store, NOW - 1800, 600, gpus=8)
    before = data_bytes(store.db)
    cap = before // 3
    report = prune(store.db, Retention(raw_s=None, max_bytes=cap), now=NOW)
    assert report.bytes_after <= cap < report.bytes_before
    assert store.count(recent, "gpu_samples") == 600 * 8  # the last hour always stays


def test_rollup_tier_has_a_mean_and_max_per_number() -> None:
    cols = rollup_schema("gpu_samples")
    assert {"session_id", "bucket", "n", "index", "uuid", "util_pct", "util_pct_max"} <= set(cols)
    assert "ts" not in cols and "index_max" not in cols


def _gpudash(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "cfg"), "XDG_DATA_HOME": str(tmp / "data")}
    return subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_store_prune_and_vacuum_commands(tmp_path: Path) -> None:
    import time

    path = tmp_path / "g.db"
    store = Store.open(path)
    sid = _fill(store, time.time() - 3 * DAY, 600, gpus=4)
    store.close()
    r = _gpudash(tmp_path, "store", "prune", "--db", str(path), "--raw-days", "1")
    assert r.returncode == 0, r.stderr
    assert "folded into 1-minute rows" in r.stdout
    r = _gpudash(tmp_path, "store", "vacuum", "--db", str(path))
    assert r.returncode == 0, r.stderr
    store = Store.open(path)
    assert store.count(sid, "gpu_samples") == 0
    assert store.db.execute("SELECT sum(n) FROM gpu_samples_1m").fetchone()[0] == 600 * 4
    store.close()


def test_store_prune_bad_size_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    Store.open(path).close()
    r = _gpudash(tmp_path, "store", "prune", "--db", str(path), "--max-bytes", "lots")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--max-bytes" in r.stderr


def test_store_config_refuses_a_tiny_cap() -> None:
    with pytest.raises(ValueError, match="at least 1 MiB"):
        StoreConfig(max_bytes=10)


def test_a_running_writer_applies_the_policy(store: Store) -> None:
    import time

    sid = _fill(store, time.time() - 2 * DAY, 120)
    writer = StoreWriter(store.path, sid, flush_interval_s=0.05, retention=Retention(raw_s=DAY, every_s=0.1))
    try:
        end = time.monotonic() + 60
        while store.count(sid, "gpu_samples") and time.monotonic() < end:
            writer.flush()
            time.sleep(0.05)
    finally:
        writer.close()
    assert store.count(sid, "gpu_samples") == 0
    assert store.db.execute("SELECT sum(n) FROM gpu_samples_1m").fetchone()[0] == 240


def test_the_minute_tier_is_exported_and_counted(store: Store, tmp_path: Path) -> None:
    import csv

    from gpudash.store.export import export_session

    sid = _fill(store, NOW - 2 * DAY, 120)
    prune(store.db, Retention(raw_s=DAY), now=NOW)
    (info,) = store.sessions()
    assert info.rows["gpu_samples_1m"] == 4 and info.rows["host_samples_1m"] == 2
    done = {e.table: e for e in export_session(store, sid, "csv", tmp_path / "out")}
    assert done["gpu_samples_1m"].rows == 4 and "events" in done
    with done["gpu_samples_1m"].path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["source"] for r in rows} == {"sim:h200"} and {r["n"] for r in rows} == {"60"}
