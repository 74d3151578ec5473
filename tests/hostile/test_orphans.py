"""No process outlives gpudash: a server's own children die with it too, however gpudash ends (kill -9 or
a hang-up, of `gpudash serve` and of the dashboard), in whatever order the server and gpudash go.

A real `gpudash serve` / `gpudash launch` (the dashboard on a pseudo-terminal) runs a vLLM stand-in that
starts a child of its own; the test waits until the server is ready, then kills or hangs up gpudash.
"""

from __future__ import annotations

import os
import pty
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hostile_helpers import (ENTRY, WAIT_S, alive_after_wait, cli_env, drain_pty, kill_all, server_config,
                             vllm_with_a_child)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the keeper is Linux's")


def _ready(db: Path) -> bool:
    try:
        with sqlite3.connect(db, timeout=5) as c:
            return c.execute("SELECT count(*) FROM events WHERE kind = 'server.ready'").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def _ours(tmp: Path) -> list[int]:
    """Every process whose command line names a file under `tmp` (the server, its keeper)."""
    out = []
    for p in psutil.process_iter():
        try:
            if str(tmp) in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def _start(how: str, tmp: Path) -> tuple[subprocess.Popen, int | None]:
    exe, _ = vllm_with_a_child(tmp)
    args = ["--config", str(server_config(tmp, exe))]
    db = tmp / "g.db"
    if how == "serve":
        argv = [sys.executable, *ENTRY, *args, "serve", "--db", str(db), "--sim", "h200", "--quiet"]
        return subprocess.Popen(argv, env=cli_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), None
    master, slave = pty.openpty()
    argv = [sys.executable, *ENTRY, *args, "launch", "--db", str(db), "--sim", "h200"]
    env = {**cli_env(tmp), "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    proc = subprocess.Popen(argv, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    return proc, master


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["kill-9", "hup"])
@pytest.mark.parametrize("how", ["serve", "launch"])
def test_a_servers_child_dies_with_gpudash(tmp_path: Path, how: str, sig: int) -> None:
    proc, master = _start(how, tmp_path)
    if master is not None:
        drain_pty(master)
    pidfile, db = tmp_path / "child.pid", tmp_path / "g.db"
    left: list[int] = []
    try:
        end = time.monotonic() + WAIT_S
        while not (pidfile.exists() and _ready(db)) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        assert pidfile.exists() and _ready(db), f"the server never became ready (gpudash exit {proc.poll()})"
        child = int(pidfile.read_text())
        group = [child, *_ours(tmp_path)]
        proc.send_signal(sig)
        proc.wait(WAIT_S)
        left = alive_after_wait(group, 20.0)  # the bound: still alive 20 s later was the failure
        assert left == [], f"outlived gpudash: {[(p, psutil.Process(p).cmdline()) for p in left]}"
    finally:
        proc.kill()
        kill_all(left + ([int(pidfile.read_text())] if pidfile.exists() else []))
        if master is not None:
            os.close(master)
