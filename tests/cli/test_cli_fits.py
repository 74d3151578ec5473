"""Every command's text fits the terminal it runs in (COLUMNS=80 stands for an 80-column terminal: tables
split into groups of whole columns, long lines wrapped under their indent) and keeps one record per line
when piped. Each command runs as a real process on a sim rig, with its own config and data dirs."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
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


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """gpudash on a real terminal of 80x24 (a pty with that window size, COLUMNS unset, stdout and stderr
    on it, as a shell runs a command), or with stderr alone on it (`stdout=PIPE`): the lines it writes,
    as the terminal receives them, before the terminal wraps any of them."""

    def __init__(self, tmp: Path, *args: str, stdout: int | None = None, extra: dict[str, str] | None = None) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, WIDTH, 0, 0))
        e = {k: v for k, v in env(tmp).items() if k not in ("COLUMNS", "LINES")} | (extra or {})
        self.proc = subprocess.Popen(cmd(*args), stdin=subprocess.DEVNULL, stdout=slave if stdout is None else stdout,
                                     stderr=slave, env=e, cwd=tmp, text=True)
        os.close(slave)
        self._master, self._buffer, self.lines = master, b"", []

    def readline(self, timeout: float = 60) -> str | None:
        """The next line (None once the program has closed the terminal)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            assert time.monotonic() < deadline, f"no line within {timeout:.0f}s: {self.lines}"
            if select.select([self._master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(self._master, 4096)
                except OSError:  # EIO: every writer has gone
                    chunk = b""
                if not chunk:
                    rest, self._buffer = self._buffer, b""
                    return self._keep(rest) if rest else None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return self._keep(line)

    def _keep(self, raw: bytes) -> str:
        line = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\r")
        self.lines.append(line)
        return line

    def finish(self, timeout: float = 120) -> list[str]:
        while self.readline(timeout) is not None:
            pass
        self.proc.wait(timeout=timeout)
        os.close(self._master)
        return self.lines


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
    """`serve --prometheus ADDR` prints the exporter's URL (which answers) among status lines that fit the
    terminal its stderr is (80 columns)."""
    port, closed = free_ports(2)
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text(f'[probe]\nenabled = false\n[sampling]\ninterval_s = 0.2\n'
                   f'[[servers]]\nname = "elsewhere"\nkind = "llama.cpp"\nurl = "http://127.0.0.1:{closed}"\n')
    term = Terminal(tmp_path, "--config", str(cfg), "serve", "--sim", "h200", "--db", str(tmp_path / "s.db"),
                    "--prometheus", f"127.0.0.1:{port}", stdout=subprocess.PIPE)
    proc, said = term.proc, term.lines
    try:
        while not any("elsewhere attached at" in ln for ln in said):
            assert proc.poll() is None and term.readline() is not None, said
        url = f"http://127.0.0.1:{port}/metrics"
        assert f"gpudash serve: Prometheus metrics at {url}" in said
        assert "gpudash_box_info" in httpx.get(url, timeout=10).text
        proc.send_signal(signal.SIGINT)
        term.finish(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, said
    assert too_wide("\n".join(said)) == [] and any(ln.startswith("    ") for ln in said)  # wrapped, indented
    listed = gpudash(tmp_path, "history", "--db", str(tmp_path / "s.db"), columns=None)
    assert "gpudash serve" in listed.stdout.splitlines()[1]  # history says what recorded the session


def test_piped_stderr_is_not_wrapped_at_columns(tmp_path: Path) -> None:
    """Warnings on a piped stderr are log records: one line each, even where COLUMNS is set (issue 45, 3)."""
    r = gpudash(tmp_path, "store", "prune", "--db", str(tmp_path / "absent" / "x.db"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and len(r.stderr) > WIDTH, r.stderr


def _no_llama_server(tmp: Path) -> dict[str, str]:
    """No llama-server for the command: none on PATH, none in its (empty) cache."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp / "cache")}


def test_llama_list_store_prune_and_demo_model_fit_a_real_80_column_terminal(tmp_path: Path) -> None:
    """issue 45, 3: `llama list` (211 characters), `store prune` (126-130) and `demo-model` (138) printed
    lines an 80-column terminal breaks mid-word; they fit it now, and stay one record a line when piped."""
    db = tmp_path / "deep" / "folder" / "names" / "that" / "make" / "the" / "path" / "long" / "g.db"
    db.parent.mkdir(parents=True)
    with Store.open(db) as store:
        store.end_session(store.begin_session("sim:h200", Config(), note="x"))
    model = tmp_path / "a-model-with-a-rather-long-name-for-the-demo-folder" / "demo-model-of-a-new-user.gguf"
    model.parent.mkdir()
    runs = [("llama", "list"), ("store", "prune", "--db", str(db)), ("demo-model", str(model))]
    for args in runs:
        term = Terminal(tmp_path, *args, extra=_no_llama_server(tmp_path))
        lines = term.finish()
        assert term.proc.returncode == 0, lines
        assert lines and too_wide("\n".join(lines)) == [], (args, lines)
    piped = gpudash(tmp_path, "llama", "list", columns=None)
    assert len(piped.stdout.splitlines()) == 1


def test_record_progress_fits_a_real_80_column_terminal(tmp_path: Path) -> None:
    db = tmp_path / "a" / "folder" / "deep" / "enough" / "that" / "records" / "run" / "long" / "r.db"
    term = Terminal(tmp_path, "record", "--sim", "8xh20", "--db", str(db), "--duration", "6", "--interval", "0.5")
    lines = term.finish()
    assert term.proc.returncode == 0, lines
    assert any("GPU rows" in ln for ln in lines) and too_wide("\n".join(lines)) == [], lines


def test_llama_list_doctor_and_demo_model_say_a_build_is_running(tmp_path: Path) -> None:
    """issue 45, 2: while another process builds llama-server (it holds the build lock; its log has reached
    step 45/208), `llama list`, `doctor` and `demo-model` say so instead of suggesting a second build."""
    cache = tmp_path / "cache" / "gpudash" / "llama-server" / ".build"
    log = cache / "logs" / "11434.0.0-cpu-20261205T120000.000000Z-1.log"
    log.parent.mkdir(parents=True)
    log.write_text("$ cmake --build ...\n[44/208] Building CXX object a.o\n[45/208] Building CXX object b.o\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from gpudash.launcher.llama.build_lock import build_lock\n"
         "from gpudash.launcher.llama.source_build import parse_progress\n"
         "with build_lock(Path(sys.argv[1]), '11434.0.0-cpu', Path(sys.argv[2]), None, parse_progress):\n"
         "    print('locked', flush=True)\n    time.sleep(120)\n", str(cache), str(log)],
        stdout=subprocess.PIPE, text=True, env=env(tmp_path))
    try:
        assert holder.stdout.readline().strip() == "locked"
        extra = _no_llama_server(tmp_path)
        building = f"being built (pid {holder.pid}, compiled 45/208, log {log})"
        said = {}
        for args in (("llama", "list"), ("doctor", "--sim", "h200", "--load-seconds", "0.1"),
                     ("demo-model", str(tmp_path / "m.gguf"))):
            r = subprocess.run(cmd(*args), capture_output=True, text=True, env=env(tmp_path) | extra, cwd=tmp_path,
                               timeout=120)
            said[args[0]] = r.stdout + r.stderr
            assert building in said[args[0]] and "`gpudash llama build` makes" not in said[args[0]], said[args[0]]
    finally:
        holder.kill()
        holder.wait()
