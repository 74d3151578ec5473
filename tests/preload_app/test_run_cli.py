"""`gpudash run -- CMD`: the environment the program gets (checked by the stand-in preload library
from inside the program), exit codes, signal forwarding, the --stats summary and the clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpudash.preload import shm as P

GPUDASH = [sys.executable, "-m", "gpudash"]
# Prints what the stand-in library published from inside this very process, and the environment.
SELF_REPORT = ("import json, os; from gpudash.preload import shm as P; s = P.StatsView(os.getpid()).read(); "
               "print(json.dumps({'name': s.name, 'state': s.state, 'knobs': s.knobs, "
               "'env': {k: os.environ.get(k) for k in ('LD_PRELOAD', 'GPUDASH_PRELOAD_KNOBS')}}))")


def _run(args: list[str], tmp_path: Path, config: str = "", **kw) -> subprocess.CompletedProcess:
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text(config)
    return subprocess.run([*GPUDASH, "--config", str(cfg), "run", *args], capture_output=True, text=True,
                          timeout=120, **kw)


def test_the_program_runs_under_the_library_with_name_and_knobs(stub_preload: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LD_PRELOAD": "/nonexistent/libkeep.so"}
    r = _run(["--name", "loader", "--knob", "staging_threads=8", "--knob", "h2d_chunk_bytes=4MiB", "--",
              sys.executable, "-c", SELF_REPORT], tmp_path, "[engine]\noutstanding = 3\n", env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["name"] == "loader" and got["state"] == "active"
    assert got["env"]["LD_PRELOAD"] == f"{stub_preload}:/nonexistent/libkeep.so"
    assert got["env"]["GPUDASH_PRELOAD_KNOBS"] == "h2d_chunk_bytes=4194304,outstanding=3,staging_threads=8"
    # parsed by the library inside the program; the knobs neither the file nor --knob set keep its defaults
    assert got["knobs"]["staging_threads"] == 8 and got["knobs"]["outstanding"] == 3
    assert got["knobs"]["h2d_chunk_bytes"] == 4 * 2**20 and got["knobs"]["d2h_chunk_bytes"] == 5_370_000


def test_the_exit_code_is_the_programs(stub_preload: Path, tmp_path: Path) -> None:
    assert _run(["--", sys.executable, "-c", "raise SystemExit(7)"], tmp_path).returncode == 7
    prog = "import os, signal; print(os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGUSR1)"
    killed = _run(["--", sys.executable, "-c", prog], tmp_path)
    assert killed.returncode == 128 + signal.SIGUSR1
    pid = int(killed.stdout.split()[0])  # it died without removing its blocks: gpudash run did
    assert not (P.SHM_DIR / f"{P.STATS_PREFIX}{pid}").exists()
    assert not (P.SHM_DIR / f"{P.KNOBS_PREFIX}{pid}").exists()


def test_signals_sent_to_gpudash_reach_the_program(stub_preload: Path, tmp_path: Path) -> None:
    prog = ("import signal, sys\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(42)))\n"
            "print('ready', flush=True)\n"
            "signal.pause()\n")
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text("")
    p = subprocess.Popen([*GPUDASH, "--config", str(cfg), "run", "--", sys.executable, "-c", prog],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 42, err
    assert out.strip() == "got TERM"


def test_stats_of_a_program_that_crashed_are_printed_and_its_blocks_removed(stub_preload: Path,
                                                                            tmp_path: Path) -> None:
    prog = "import os; print(os.getpid(), flush=True); os._exit(5)"  # no exit handlers: blocks left behind
    r = _run(["--stats", "--name", "crashy", "--", sys.executable, "-c", prog], tmp_path)
    assert r.returncode == 5
    pid = int(r.stdout.split()[0])
    assert f"engine stats of crashy (pid {pid}, active):" in r.stderr
    table = [ln.split() for ln in r.stderr.splitlines() if ln.strip().startswith(("h2d", "d2h"))]
    assert [row[:3] for row in table] == [["h2d", "0", "0"], ["d2h", "0", "0"]]
    assert not (P.SHM_DIR / f"{P.STATS_PREFIX}{pid}").exists()
    assert not (P.SHM_DIR / f"{P.KNOBS_PREFIX}{pid}").exists()


def test_a_missing_library_is_one_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, P.PRELOAD_LIB_ENV: str(tmp_path / "missing.so")}
    r = _run(["--", "true"], tmp_path, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"gpudash: {P.PRELOAD_LIB_ENV}={tmp_path / 'missing.so'} is not a file; unset it or point it at "
        f"{P.PRELOAD_LIB_NAME}"]


def test_bad_knobs_and_commands_are_usage_errors(stub_preload: Path, tmp_path: Path) -> None:
    cases = {
        ("--knob", "staging_threads"): "--knob expects NAME=VALUE, got 'staging_threads'",
        ("--knob", "registration_cache_bytes=1GiB"): "--knob registration_cache_bytes: not a knob of a preloaded engine",
        ("--knob", "outstanding=0"): "--knob outstanding: outstanding must be between 1 and 64, got 0",
        ("--knob", "h2d_chunk_bytes=lots"): "--knob h2d_chunk_bytes: expected a size like",
    }
    for args, message in cases.items():
        r = _run([*args, "--", "true"], tmp_path)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
    r = _run(["--", str(tmp_path / "no-such-program")], tmp_path)
    assert r.returncode == 127 and "cannot run" in r.stderr and "No such file or directory" in r.stderr
