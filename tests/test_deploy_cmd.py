"""`gpudash deploy`: each target's files as this installation has them, printed or written into --out,
never over a differing file without --force. (The wheel test runs it from an installed wheel too.)"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
from pathlib import Path

from gpudash.commands.deploy import hidden_paths

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


def test_a_gpudash_the_units_sandbox_hides_is_named(tmp_path: Path) -> None:
    """A venv under /tmp: the unit's PrivateTmp=yes gives the service an empty /tmp, so its ExecStart cannot
    run. deploy says so for whatever the unit hides (/tmp, /var/tmp, home folders), by the program, the file
    its links lead to, or the interpreter its #! line names; a program outside them gets no note."""
    if not tmp_path.is_relative_to("/tmp"):
        tmp_path = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's basetemp elsewhere: make one under /tmp
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    script = venv / "gpudash"
    script.write_text(f"#!{venv / 'python'}\nfrom gpudash.cli import main\nmain()\n")
    script.chmod(0o755)
    # the link runs the base interpreter: this checkout and this environment's packages come by PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *site.getsitepackages()])}
    r = subprocess.run([str(venv / "python"), "-m", "gpudash", "deploy", "systemd", "--out", str(tmp_path / "u")],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"ExecStart={script} record" in (tmp_path / "u" / "gpudash-record.service").read_text()
    assert f"note: ExecStart runs {script}, under /tmp, which the unit's PrivateTmp=yes hides" in r.stderr


def test_hidden_paths_follow_the_units_own_settings() -> None:
    unit = (REPO / "deploy/systemd/gpudash-record.service").read_text()
    assert set(hidden_paths(unit)) == {"/tmp", "/var/tmp", "/root", "/home", "/run/user"}
    assert hidden_paths(unit.replace("PrivateTmp=yes", "PrivateTmp=no").replace("ProtectHome=read-only",
                                                                                "ProtectHome=no")) == {}
