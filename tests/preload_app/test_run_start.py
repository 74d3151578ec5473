"""`gpudash run` starts its program first (issue 47): at the moment the program is spawned gpudash has imported
neither the settings model (pydantic) nor the engine's copy machinery (numpy) nor the block readers; the
program gets the signal state a program started by a shell gets; the config file's [engine] table and this
machine's tuned knobs still reach it, and a bad [engine] value still stops everything before the start."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

# Runs the real CLI in a fresh interpreter and notes which modules it holds when it spawns the program.
AT_SPAWN = r"""
import json, os, sys
seen = {}
real = os.posix_spawnp
def spy(*args, **kwargs):
    seen["modules"] = sorted(sys.modules)
    return real(*args, **kwargs)
os.posix_spawnp = spy
from gpudash.cli import main
try:
    main(sys.argv[1:], prog_name="gpudash")
except SystemExit as done:
    seen["rc"] = done.code
print(json.dumps(seen))
"""
HEAVY = ("numpy", "pydantic", "pydantic_core", "psutil", "rich", "httpx", "gpudash.engine.transfer",
         "gpudash.engine.buffers", "gpudash.preload.shm", "gpudash.config.settings", "gpudash.runtime.tuned")


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}


def _at_spawn(tmp_path: Path, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", AT_SPAWN, *args], capture_output=True, text=True, env=_env(tmp_path),
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config" / "gpudash" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_program_is_spawned_before_the_heavy_imports(stub_preload: Path, tmp_path: Path) -> None:
    bare = _at_spawn(tmp_path, "run", "--", "true")
    assert bare["rc"] == 0 and "modules" in bare, bare.get("rc")
    assert not [m for m in HEAVY if m in bare["modules"]]
    _config(tmp_path, '[engine]\nstaging_threads = 4\nh2d_chunk_bytes = "4MiB"\n\n[probe]\nenabled = true\n')
    knobs = _at_spawn(tmp_path, "run", "--knob", "outstanding=3", "--", "true")
    assert knobs["rc"] == 0 and not [m for m in HEAVY if m in knobs["modules"]]


def test_the_program_gets_the_signal_state_a_shell_gives(stub_preload: Path, tmp_path: Path) -> None:
    """SIGPIPE and SIGXFSZ at their defaults (Python ignores them) and no signal blocked (gpudash blocks the
    ones it forwards while it waits)."""
    r = subprocess.run([sys.executable, "-m", "gpudash", "run", "--", "cat", "/proc/self/status"],
                       capture_output=True, text=True, env=_env(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    status = dict(line.split(":", 1) for line in r.stdout.splitlines())
    ignored, blocked = int(status["SigIgn"], 16), int(status["SigBlk"], 16)
    for sig in (13, 25):  # SIGPIPE, SIGXFSZ
        assert not ignored & (1 << (sig - 1)), sig
    assert blocked == 0


SELF_KNOBS = "import os; print(os.environ.get('GPUDASH_PRELOAD_KNOBS'))"


def _knobs_seen(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudash", "run", *args, "--", sys.executable, "-c", SELF_KNOBS],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=120)


def test_the_config_files_engine_table_and_tuned_knobs_reach_the_program(stub_preload: Path,
                                                                         tmp_path: Path) -> None:
    """A knob tuned on this machine holds where the file leaves it unset; the file's own wins where it sets it."""
    _config(tmp_path, "[engine]\noutstanding = 3\n")
    identity = f"{socket.gethostname()}; no NVIDIA GPU"  # runtime/tuned.py's identity of a box without GPUs
    tuned = tmp_path / "config" / "gpudash" / "tuned" / f"engine-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.toml"
    tuned.parent.mkdir(parents=True)
    tuned.write_text(f'machine = "{identity}"\n\n[engine]\nstaging_threads = 5\noutstanding = 9\n')
    r = _knobs_seen(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "outstanding=3,staging_threads=5"


def test_a_bad_engine_table_stops_the_run_with_the_files_own_problem_lines(stub_preload: Path,
                                                                           tmp_path: Path) -> None:
    path = _config(tmp_path, "[engine]\noutstanding = 0\nwarp = 1\n")
    r = _knobs_seen(tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"gpudash: {path}: engine.outstanding: outstanding must be between 1 and 64, got 0",
        f"gpudash: {path}: engine.warp: unknown field; remove it or check its spelling (`gpudash config show` "
        "lists every field)"]
    path.write_text("[engine\n")
    r = _knobs_seen(tmp_path)
    assert r.returncode == 2 and r.stdout == "" and "not valid TOML" in r.stderr


def test_only_the_engine_table_is_the_programs(stub_preload: Path, tmp_path: Path) -> None:
    """A problem elsewhere in the file is for the commands that read that part: the program runs."""
    _config(tmp_path, "[engine]\nstaging_threads = 2\n\n[probe]\nconcurrency = 0\n")
    r = _knobs_seen(tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "staging_threads=2", r.stderr
