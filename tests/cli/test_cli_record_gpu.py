"""`gpudash record --no-sim` on a real GPU machine: the session is labelled nvml and every GPU gets a row a tick."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cli_helpers import query, run

pytestmark = pytest.mark.gpu


def test_record_on_real_gpus_writes_nvml_rows_for_every_gpu(tmp_path: Path) -> None:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True, timeout=30)
    uuids = {line.split(",")[1].strip() for line in smi.stdout.strip().splitlines()}
    db = tmp_path / "gpu.db"
    proc = run(tmp_path, "record", "--no-sim", "--duration", "3", "--interval", "0.5", "--db", str(db), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert query(db, "SELECT source FROM sessions") == [("nvml",)]
    per_gpu = dict(query(db, "SELECT uuid, count(*) FROM gpu_samples GROUP BY uuid"))
    assert set(per_gpu) == uuids
    assert all(abs(n - 6) <= 1 for n in per_gpu.values()), per_gpu
    assert query(db, "PRAGMA integrity_check") == [("ok",)]
