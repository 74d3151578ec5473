"""Every command's text fits the terminal it runs in (COLUMNS=80 stands for an 80-column terminal: tables
split into groups of whole columns, long lines wrapped under their indent) and keeps one record per line
when piped. Each command runs as a real process on a sim rig, with its own config and data dirs."""

from __future__ import annotations

import signal
import subprocess
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from gpudash.config import Config
from gpudash.config.servers import SPEC_CLASSES, ServerSpec
from gpudash.store import Store

from cli_helpers import cmd, env, free_ports

WIDTH = 80


def gpudash(tmp: Path, *args: str, columns: int | None = WIDTH, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run gpudash with stdout piped; `columns` set in COLUMNS as a terminal of that width would (None: piped)."""
    e = {k: v for k, v in env(tmp).items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        e["COLUMNS"] = str(columns)
    return subprocess.run(cmd(*args), capture_output=True, text=True, env=e, cwd=tmp, timeout=timeout)


def too_wide(text: str, width: int = WIDTH) -> list[str]:
    return [ln for ln in text.splitlines() if len(ln) > width]


@pytest.fixture(scope="module")
def sessions_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three sessions with long notes: what `history` prints 150-200 characters wide."""
    path = tmp_path_factory.mktemp("history") / "h.db"
    with Store.open(path) as store:
        for source, note in (("sim:rtx5080+rtx3090", "gpudash serve (demo)"),
                             ("sim:8xh20", "gpudash probe http://127.0.0.1:41234"), ("nvml", "gpudash launch")):
            sid = store.begin_session(source, Config(), note=note)
            store.end_session(sid)
    return path


def test_history_fits_80_columns_and_is_a_line_a_session_when_piped(tmp_path: Path, sessions_db: Path) -> None:
    narrow = gpudash(tmp_path, "history", "--db", str(sessions_db))
    assert narrow.returncode == 0, narrow.stderr
    assert too_wide(narrow.stdout) == []
    assert "gpudash probe http://127.0.0.1:41234" in narrow.stdout and "sessions: when and where" in narrow.stdout
    piped = gpudash(tmp_path, "history", "--db", str(sessions_db), columns=None)
    lines = piped.stdout.splitlines()
    assert len(lines) == 1 + 3 and lines[0].split()[:7] == ["id", "started", "ended", "duration", "source", "what",
                                                             "rows"]
    assert "gpudash probe http://127.0.0.1:41234  ticks 0" in lines[2]
    wide = gpudash(tmp_path, "history", "--db", str(sessions_db), columns=200)
    assert len(wide.stdout.splitlines()) == 4  # wide enough: one table, a line a session


def test_doctor_wraps_under_its_indent_at_80_and_not_when_piped(tmp_path: Path) -> None:
    narrow = gpudash(tmp_path, "doctor", "--sim", "rtx5080+rtx3090", "--load-seconds", "0.1")
    assert narrow.returncode == 0, narrow.stderr
    assert too_wide(narrow.stdout) == [] and too_wide(narrow.stderr) == []
    lines = narrow.stdout.splitlines()
    fix = next(i for i, ln in enumerate(lines) if ln.startswith("      fix: the slot holds"))
    assert lines[fix + 1].startswith("           ") and lines[fix + 1].strip()  # the fix's rows under its words
    piped = gpudash(tmp_path, "doctor", "--sim", "rtx5080+rtx3090", "--load-seconds", "0.1", columns=None)
    fixes = [ln for ln in piped.stdout.splitlines() if ln.startswith("      fix: the slot holds")]
    assert len(fixes) == 1 and fixes[0].endswith("or accept the slower copies")  # one line, whole


def test_bench_overlap_splits_its_table_at_80_columns(tmp_path: Path) -> None:
    narrow = gpudash(tmp_path, "bench", "overlap", "--sim", "8xh20", "--tokens", "512")
    assert narrow.returncode == 0, narrow.stderr
    assert too_wide(narrow.stdout) == []
    assert "compute against communication" in narrow.stdout and "layer time" in narrow.stdout
    piped = gpudash(tmp_path, "bench", "overlap", "--sim", "8xh20", "--tokens", "512", columns=None)
    rows = [ln for ln in piped.stdout.splitlines() if ln[:1].isdigit()]
    assert len(rows) == 8 and all("GB/s)" in r and "%" in r for r in rows)  # a GPU a line, every column


def test_plan_wraps_its_reason_at_80_and_not_when_piped(tmp_path: Path) -> None:
    narrow = gpudash(tmp_path, "plan", "--sim", "rtx5080+rtx3090", "--model-gb", "30")
    assert narrow.returncode == 0, narrow.stderr
    assert too_wide(narrow.stdout) == [] and "-ts " in narrow.stdout
    piped = gpudash(tmp_path, "plan", "--sim", "rtx5080+rtx3090", "--model-gb", "30", columns=None)
    why = [ln for ln in piped.stdout.splitlines() if ln.startswith("why: ")]
    assert len(why) == 1 and len(why[0]) > WIDTH  # the reason whole on its line


@pytest.mark.parametrize("profile, relays", [
    ("rtx5080+rtx3090", "relays: none on SIM rtx5080+rtx3090: its GPUs cannot copy peer to peer"),
    ("h200", "relays: none on SIM h200: one GPU"),
    ("8xh20", "relays (SIM 8xh20): a 1 GiB copy into GPU 0 over its own link and through 7 peer GPUs")])
def test_bench_engine_fits_80_columns_and_speaks_of_its_own_rigs_relays(tmp_path: Path, profile: str,
                                                                         relays: str) -> None:
    """The relay line is about the rig benched (8xh20's NVLink relays were printed on every rig)."""
    r = gpudash(tmp_path, "bench", "engine", "--backend", "sim", "--profile", profile, "--sizes", "64KiB,8MiB",
                "--no-store")
    assert r.returncode == 0, r.stderr
    assert too_wide(r.stdout) == []
    assert relays in r.stdout.replace("\n  ", " ")
    if profile != "8xh20":
        assert "8xh20" not in r.stdout
    assert r.stdout.count("64 KiB") == 2 * 6  # two tables at 80 columns, six rows each


def test_config_show_fits_80_columns_and_shows_every_servers_field(tmp_path: Path) -> None:
    (tmp_path / "xdg-config").mkdir()
    r = gpudash(tmp_path, "config", "show")
    assert r.returncode == 0, r.stderr
    assert too_wide(r.stdout) == []
    lines = r.stdout.splitlines()
    for cls in {ServerSpec, *SPEC_CLASSES.values()}:  # every field a [[servers]] entry takes, documented
        for name in cls.model_fields:
            assert f"#{name} = " in r.stdout or f"# {name}: unset" in r.stdout or f"#[servers.{name}]" in lines, name
    assert "#url = \"http://127.0.0.1:8080\"" in lines and "#[[servers]]" in lines
    assert "servers = []" not in lines
    assert tomllib.loads(r.stdout)["sampling"]["interval_s"] == 1.0  # still the effective config, as TOML


def test_serve_says_where_prometheus_scrapes_and_wraps_its_lines(tmp_path: Path) -> None:
    """`serve --prometheus ADDR` prints the exporter's URL (which answers) among status lines that fit."""
    port, closed = free_ports(2)
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text(f'[probe]\nenabled = false\n[sampling]\ninterval_s = 0.2\n'
                   f'[[servers]]\nname = "elsewhere"\nkind = "llama.cpp"\nurl = "http://127.0.0.1:{closed}"\n')
    e = {k: v for k, v in env(tmp_path).items() if k not in ("COLUMNS", "LINES")} | {"COLUMNS": str(WIDTH)}
    proc = subprocess.Popen(cmd("--config", str(cfg), "serve", "--sim", "h200", "--db", str(tmp_path / "s.db"),
                                "--prometheus", f"127.0.0.1:{port}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=tmp_path)
    said: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any("elsewhere attached at" in ln for ln in said):
            assert time.monotonic() < deadline and proc.poll() is None, said
            said.append(proc.stderr.readline().rstrip("\n"))
        url = f"http://127.0.0.1:{port}/metrics"
        assert f"gpudash serve: Prometheus metrics at {url}" in said
        assert "gpudash_box_info" in httpx.get(url, timeout=10).text
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        said += err.splitlines()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, said
    assert too_wide("\n".join(said)) == [] and any(ln.startswith("    ") for ln in said)  # wrapped, indented
    listed = gpudash(tmp_path, "history", "--db", str(tmp_path / "s.db"), columns=None)
    assert "gpudash serve" in listed.stdout.splitlines()[1]  # history says what recorded the session
