"""Issue 45 item 16: every exported Parquet file says where its rows came from, also one whose table is
empty (no row to carry the `source` column): its metadata holds `gpudash.source`. The real CLI on a real
recording of the sim rig, which writes no requests and no events."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from hostile_helpers import gpudash


def test_every_parquet_file_carries_the_source_even_an_empty_tables(tmp_path: Path) -> None:
    db, out = tmp_path / "g.db", tmp_path / "out"
    assert gpudash("record", "--sim", "h200", "--duration", "0.5", "--quiet", "--db", str(db),
                   home=tmp_path).returncode == 0
    r = gpudash("export", "latest", "--format", "parquet", "--out", str(out), "--db", str(db), home=tmp_path)
    assert r.returncode == 0, r.stderr
    files = sorted(out.glob("*.parquet"))
    assert any(pq.read_metadata(f).num_rows == 0 for f in files)  # the case: a table with no rows
    labels = {f.name: (pq.read_schema(f).metadata or {}).get(b"gpudash.source") for f in files}
    assert set(labels.values()) == {b"sim:h200"}, labels
