"""SIGHUP (a dropped ssh) is a stop like SIGTERM for `gpudash record`, `serve` and `launch`: what was
sampled is flushed, the session is closed, the servers stop, and the dashboard leaves the terminal as it
found it (out of the alternate screen). Real processes, a real SQLite file, the dashboard on a pty."""

from __future__ import annotations

import os
import pty
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from hostile_helpers import (ENTRY, WAIT_S, alive_after_wait, cli_env, drain_pty, kill_all, server_config,
                             vllm_with_a_child)

ALT_ON, ALT_OFF = b"\x1b[?1049h", b"\x1b[?1049l"  # xterm's alternate screen, which Textual uses


def _query(db: Path, sql: str) -> list[tuple]:
    try:
        with sqlite3.connect(db, timeout=5) as c:
            return c.execute(sql).fetchall()
    except sqlite3.Error:
        return []


def _wait_for(db: Path, sql: str, proc: subprocess.Popen) -> None:
    end = time.monotonic() + WAIT_S
    while not (_query(db, sql) and _query(db, sql)[0][0]) and time.monotonic() < end and proc.poll() is None:
        time.sleep(0.05)
    assert _query(db, sql)[0][0], f"{sql} never held (gpudash exit {proc.poll()})"


def _session(db: Path) -> tuple:
    return _query(db, "SELECT id, ended, (SELECT count(*) FROM ticks t WHERE t.session_id = s.id) FROM sessions s")[-1]


def test_a_hung_up_record_keeps_its_ticks_and_closes_its_session(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    proc = subprocess.Popen([sys.executable, *ENTRY, "record", "--sim", "h200", "--db", str(db), "--interval", "0.1"],
                            env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(db, "SELECT count(*) FROM sessions", proc)
        started = time.monotonic()
        time.sleep(1.5)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    sid, ended, ticks = _session(db)
    assert ended is not None
    assert ticks >= 3, f"only {ticks} ticks of {time.monotonic() - started:.1f} s at 10 Hz reached the file"


def test_a_hung_up_serve_stops_its_servers_and_closes_its_session(tmp_path: Path) -> None:
    exe, pidfile = vllm_with_a_child(tmp_path)
    db = tmp_path / "g.db"
    proc = subprocess.Popen([sys.executable, *ENTRY, "--config", str(server_config(tmp_path, exe)), "serve", "--db",
                             str(db), "--sim", "h200", "--quiet"], env=cli_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(db, "SELECT count(*) FROM events WHERE kind = 'server.ready'", proc)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
        child = [int(pidfile.read_text())] if pidfile.exists() else []
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    sid, ended, ticks = _session(db)
    assert ended is not None and ticks > 0
    assert _query(db, "SELECT count(*) FROM events WHERE kind = 'server.stop'")[0][0] == 1
    left = alive_after_wait(child, 20.0)
    kill_all(left)
    assert left == []


def test_a_hung_up_dashboard_restores_the_terminal_and_closes_its_session(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    master, slave = pty.openpty()
    env = {**cli_env(tmp_path), "TERM": "xterm-256color"}
    proc = subprocess.Popen([sys.executable, *ENTRY, "launch", "--db", str(db), "--sim", "h200"], env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = drain_pty(master)
    try:
        _wait_for(db, "SELECT count(*) FROM ticks", proc)
        assert ALT_ON in seen, "the dashboard never entered the alternate screen"
        proc.send_signal(signal.SIGHUP)
        proc.wait(WAIT_S)
        time.sleep(0.2)  # the last output, read in the background
    finally:
        proc.kill()
        os.close(master)
    assert proc.returncode == 0, bytes(seen[-2000:])
    assert seen.rfind(ALT_OFF) > seen.rfind(ALT_ON), "the terminal was left in the alternate screen"
    sid, ended, ticks = _session(db)
    assert ended is not None and ticks > 0


def test_a_terminal_that_goes_away_ends_record_serve_and_launch_cleanly(tmp_path: Path) -> None:
    """The real hang-up: gpudash runs on a terminal (its controlling tty) that then goes away, as an ssh
    session's does. After it every write to that terminal fails; the commands still stop cleanly, exit 0,
    and close their sessions."""
    exe, pidfile = vllm_with_a_child(tmp_path)
    cfg = server_config(tmp_path, exe)
    for what, ready in (("record", "SELECT count(*) FROM ticks"),
                        ("serve", "SELECT count(*) FROM events WHERE kind = 'server.ready'"),
                        ("launch", "SELECT count(*) FROM ticks")):
        db = tmp_path / f"{what}.db"
        argv = [sys.executable, *ENTRY, "--config", str(cfg), what, "--sim", "h200", "--db", str(db)]
        pid, master = pty.fork()  # the child's controlling terminal is this pty
        if pid == 0:
            os.execve(argv[0], argv, {**cli_env(tmp_path), "TERM": "xterm-256color"})
        seen = drain_pty(master)
        try:
            end = time.monotonic() + WAIT_S
            while not (_query(db, ready) and _query(db, ready)[0][0]) and time.monotonic() < end:
                time.sleep(0.05)
            assert _query(db, ready)[0][0], bytes(seen[-2000:])
        finally:
            os.close(master)  # the terminal goes away: the kernel hangs up its session
        end = time.monotonic() + WAIT_S
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < end:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, f"{what}: {done}"
        sid, ended, ticks = _session(db)
        assert ended is not None and ticks > 0, what
    kill_all([int(pidfile.read_text())] if pidfile.exists() else [])
