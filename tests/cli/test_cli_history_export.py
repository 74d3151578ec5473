"""`gpudash history` and `gpudash export` as real processes over a DB written by the store writer."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpudash import fmt
from gpudash.config import Config
from gpudash.records import GpuSample, HostSample, Snapshot
from gpudash.store import SESSION_TABLES, Store, StoreWriter

from cli_helpers import query, run


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "h.db"
    store = Store.open(path)
    for source, n in (("sim:h200", 5), ("sim:8xh20", 12)):
        sid = store.begin_session(source, Config())
        writer = StoreWriter(path, sid)
        gpus = 1 if source == "sim:h200" else 8
        for t in range(n):
            ts = 1000.0 + t
            writer.submit(Snapshot(ts, t, source, gpus=tuple(GpuSample(ts, i, f"u{i}", "g", 1.0) for i in range(gpus)),
                                   host=HostSample(ts, 5.0)))
        writer.close()
        store.end_session(sid)
    store.close()
    return path


def test_history_json_parses_and_counts(tmp_path: Path, db: Path) -> None:
    proc = run(tmp_path, "history", "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    sessions = json.loads(proc.stdout)["sessions"]
    assert [s["source"] for s in sessions] == ["sim:h200", "sim:8xh20"]
    assert [s["rows"]["gpu_samples"] for s in sessions] == [5, 96]
    assert all(s["ended"] >= s["started"] and s["duration_s"] >= 0 for s in sessions)
    table = run(tmp_path, "history", "--db", str(db))
    assert table.returncode == 0 and "sim:8xh20" in table.stdout and "gpu 96" in table.stdout
    lines = table.stdout.splitlines()
    for s in sessions:  # the duration column reads as the TUI's History tab does
        line = next(ln for ln in lines if ln.split()[0] == str(s["id"]))
        assert re.search(rf" {fmt.duration(s['duration_s'])}  {s['source']} ", line), line


def _count(path: Path, fmt: str) -> int:
    if fmt == "csv":
        with path.open(newline="") as f:
            return sum(1 for _ in csv.DictReader(f))
    if fmt == "json":
        return len(json.loads(path.read_text()))
    return pq.read_metadata(path).num_rows


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_export_latest_row_counts_equal_db(tmp_path: Path, db: Path, fmt: str) -> None:
    out = tmp_path / fmt
    proc = run(tmp_path, "export", "latest", "--db", str(db), "--format", fmt, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    for table in SESSION_TABLES:
        want = 1 if table == "sessions" else query(db, f"SELECT count(*) FROM [{table}] WHERE session_id = 2")[0][0]
        assert _count(out / f"{table}.{fmt}", fmt) == want, table
    again = run(tmp_path, "export", "2", "--db", str(db), "--format", fmt, "--out", str(out))
    assert again.returncode == 2
    assert len(again.stderr.strip().splitlines()) == 1 and "--force" in again.stderr
    forced = run(tmp_path, "export", "1", "--db", str(db), "--format", fmt, "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert _count(out / f"gpu_samples.{fmt}", fmt) == 5


def test_export_unknown_session_and_missing_db_are_one_line(tmp_path: Path, db: Path) -> None:
    proc = run(tmp_path, "export", "7", "--db", str(db), "--format", "csv", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"gpudash: no session 7 in {db}; `gpudash history` lists the sessions"
    proc = run(tmp_path, "export", "latest", "--db", str(tmp_path / "nope.db"), "--format", "csv", "--out", "o")
    assert proc.returncode == 2 and "no database at" in proc.stderr
    assert not (tmp_path / "nope.db").exists()
