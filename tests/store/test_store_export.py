"""Export writes one file per table whose row counts equal the DB's, in every format, labelled with source."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpudash.store import SESSION_TABLES, StoreWriter
from gpudash.store.export import ExportError, export_session

from store_samples import SOURCE, full_snapshot


def _read(path: Path, fmt: str) -> list[dict]:
    if fmt == "csv":
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    if fmt == "json":
        return json.loads(path.read_text())
    return pq.read_table(path).to_pylist()


@pytest.fixture()
def session(store, config) -> int:
    sid = store.begin_session(SOURCE, config)
    other = store.begin_session("nvml", config)  # rows of another session must not leak into the export
    for s, n in ((sid, 9), (other, 2)):
        writer = StoreWriter(store.path, s)
        for t in range(n):
            writer.submit(full_snapshot(t, n_gpus=3))
        writer.close()
    store.end_session(sid)
    return sid


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_export_row_counts_equal_db_counts(store, session, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "out"
    done = export_session(store, session, fmt, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.{fmt}" for t in SESSION_TABLES)
    assert {e.table for e in done} == set(SESSION_TABLES)
    for e in done:
        rows = _read(e.path, fmt)
        assert len(rows) == e.rows == store.count(session, e.table), e.table
        assert all(r["source"] == SOURCE for r in rows), e.table
    gpus = _read(out / f"gpu_samples.{fmt}", fmt)
    assert len(gpus) == 27 and {str(r["session_id"]) for r in gpus} == {str(session)}
    slabs = _read(out / f"pool_samples.{fmt}", fmt)
    assert [(r["pool"], int(r["slab"]), int(r["unassigned"])) for r in slabs[:2]] == \
        [("pinned", 2**31, 2**30), ("pinned", 2**31, 2**30 - 2**20)]
    if fmt != "csv":
        events = _read(out / f"events.{fmt}", fmt)
        assert {r["ok"] for r in events} == {True, False}  # booleans stay booleans
        assert json.loads(events[1]["new"]) == {"ratios": [2, 3]}


def test_export_refuses_to_overwrite_without_force(store, session, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "events.csv").write_text("mine\n")
    with pytest.raises(ExportError, match="already exist.*events.csv.*--force"):
        export_session(store, session, "csv", out)
    assert sorted(p.name for p in out.iterdir()) == ["events.csv"]  # nothing half-written
    assert (out / "events.csv").read_text() == "mine\n"
    export_session(store, session, "csv", out, force=True)
    assert len(_read(out / "events.csv", "csv")) == store.count(session, "events")


def test_parquet_without_pyarrow_names_the_extra(store, session, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ExportError, match=r"pip install 'gpudash\[parquet\]'"):
        export_session(store, session, "parquet", tmp_path / "out")
    assert not (tmp_path / "out").exists()
