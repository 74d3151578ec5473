"""The shipped systemd unit runs a command gpudash accepts, and systemd itself finds nothing wrong with it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.launcher.health import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli_helpers import cmd, env  # noqa: E402
from unit_file import exec_argv, service  # noqa: E402

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "gpudash-record.service"


def _exec_start() -> list[str]:
    """ExecStart with its flags from the unit's Environment= (GPUDASH_FLAGS), as systemd expands them."""
    return exec_argv(service(UNIT.read_text()))


def test_the_units_command_records_and_serves(tmp_path: Path) -> None:
    """ExecStart's own arguments, with a sim rig for --no-sim, 127.0.0.1 for 0.0.0.0 and an end."""
    exe, *args = _exec_start()
    assert Path(exe).name == "gpudash" and args[:1] == ["record"]
    port = free_port()
    assert "0.0.0.0:9400" not in args  # dcgm-exporter's port: a box running both would refuse one
    swap = {"--no-sim": ["--sim", "h200"], "0.0.0.0:9401": [f"127.0.0.1:{port}"]}
    argv = [w for a in args for w in swap.get(a, [a])] + ["--duration", "4", "--db", str(tmp_path / "g.db")]
    proc = subprocess.Popen(cmd(*argv), env=env(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        text = ""
        for _ in range(40):
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1, trust_env=False).text
            except httpx.TransportError:
                text = ""
            if "gpudash_box_info" in text:
                break
            time.sleep(0.1)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"gpudash_box_info", "gpudash_gpu_pcie_link_generation", "gpudash_store_data_bytes"} <= names


def test_systemd_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (the unit's command is checked above either way)")
    unit = tmp_path / "gpudash-record.service"
    gpudash = Path(sys.executable).with_name("gpudash")
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/gpudash", str(gpudash)))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "gpudash-record.service" in ln]
    assert problems == [], problems
