"""`gpudash status` on real GPUs, beside `nvidia-smi`: the same GPUs, memory totals and clock-event
reasons, and the fields NVML cannot give shown as NA rather than zero.
Run on the GPU machine: ``pytest tests/tui/test_status_gpu.py -m gpu``."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from gpudash.cli import main

pytestmark = pytest.mark.gpu


def test_status_matches_nvidia_smi() -> None:
    exe = shutil.which("nvidia-smi")
    assert exe, "nvidia-smi is not on PATH on this GPU machine"
    smi = subprocess.run([exe, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    res = CliRunner().invoke(main, ["status", "--no-sim", "--json", "--window", "0.5"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["sim"] is False and doc["source"] == "nvml"
    assert [g["index"] for g in doc["gpus"]] == [int(line.split(",")[0]) for line in smi]
    for g, line in zip(doc["gpus"], smi):
        assert abs(g["mem_total"] / 2**20 - float(line.split(",")[1])) <= 1  # MiB, as nvidia-smi counts
        assert g["throttle"] is None or isinstance(g["throttle"], str) and g["throttle"]
        assert g["ecc_uncorrected"] is None or g["ecc_uncorrected"] >= 0
        assert g["pcie_tx_bps"] is not None and g["link_gen"] is not None
    for p in doc["gpu_processes"]:
        assert p["sm_pct"] is None or 0 <= p["sm_pct"] <= 100
