"""`gpudash bench engine --tune` on a real GPU, as a newcomer runs it: the table, the tuned knobs stored
for this machine and used by the next command, and the results recorded in the store under a `cuda` session."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from cli_helpers import query, run

pytestmark = pytest.mark.gpu


def test_bench_engine_tune_on_cuda_prints_stores_for_the_machine_and_records(tmp_path: Path) -> None:
    db = tmp_path / "bench.db"
    proc = run(tmp_path, "bench", "engine", "--backend", "cuda", "--tune", "--sizes", "64KiB,64MiB", "--db", str(db),
               timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gpudash bench engine: cuda: NVIDIA" in proc.stdout
    table = [line.split() for line in proc.stdout.splitlines() if line.startswith(("h2d ", "d2h "))]
    assert len(table) == 12  # 2 directions x 3 kinds of host memory x 2 sizes
    (stored,) = (tmp_path / "xdg-config" / "gpudash" / "tuned").glob("engine-*.toml")
    assert f"stored for this machine in {stored}" in proc.stdout
    knobs = tomllib.loads(stored.read_text())["engine"]
    assert {"h2d_chunk_bytes", "d2h_chunk_bytes", "staging_threads", "h2d_staging_bytes", "d2h_staging_bytes"} <= set(knobs)
    assert query(db, "SELECT source FROM sessions") == [("cuda",)]
    kinds = dict(query(db, "SELECT kind, count(*) FROM events GROUP BY kind"))
    assert kinds == {"engine.autotune": 1, "bench.engine": 12}
    shown = run(tmp_path, "config", "show")  # the next command finds the tuning and says so
    assert f"staging_threads = {knobs['staging_threads']}  # tuned ({stored})" in shown.stdout
