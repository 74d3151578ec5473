"""`gpudash deploy`: each target's files as this installation has them, printed or written into --out,
never over a differing file without --force. (The wheel test runs it from an installed wheel too.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def deploy(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudash", "deploy", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_one_file_is_printed_and_several_need_a_folder(tmp_path: Path) -> None:
    rules = deploy(tmp_path, "rules")
    assert rules.returncode == 0 and rules.stdout == (REPO / "deploy/prometheus/gpudash-rules.yml").read_text()
    grafana = deploy(tmp_path, "grafana")
    assert grafana.returncode == 0 and grafana.stdout == (REPO / "deploy/grafana/gpudash.json").read_text()
    both = deploy(tmp_path, "prometheus")
    assert both.returncode == 2 and "--out" in both.stderr and both.stdout == ""


def test_out_writes_and_keeps_a_differing_file_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "prom"
    r = deploy(tmp_path, "prometheus", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpudash-rules.yml", "prometheus.yml"]
    assert (out / "prometheus.yml").read_text() == (REPO / "deploy/prometheus/prometheus.yml").read_text()
    assert deploy(tmp_path, "prometheus", "--out", str(out)).returncode == 0  # the same files again: fine

    (out / "prometheus.yml").write_text("# mine\n")
    refused = deploy(tmp_path, "prometheus", "--out", str(out))
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert (out / "prometheus.yml").read_text() == "# mine\n"
    assert (out / "gpudash-rules.yml").read_text() == (REPO / "deploy/prometheus/gpudash-rules.yml").read_text()
    assert deploy(tmp_path, "prometheus", "--out", str(out), "--force").returncode == 0
    assert (out / "prometheus.yml").read_text() == (REPO / "deploy/prometheus/prometheus.yml").read_text()

    (tmp_path / "afile").write_text("")
    assert deploy(tmp_path, "rules", "--out", str(tmp_path / "afile")).returncode == 2


def test_the_unit_names_this_installations_gpudash(tmp_path: Path) -> None:
    unit = deploy(tmp_path, "systemd").stdout
    (start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert start.startswith(f"ExecStart={Path(sys.executable).parent / 'gpudash'} record ")
    shipped = (REPO / "deploy/systemd/gpudash-record.service").read_text()
    def rest(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("ExecStart=")]

    assert rest(unit) == rest(shipped)
