"""Run `gpudash` as a real subprocess with its own config/data dirs, and read the DB it leaves."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRY = ["-c", "from gpudash.cli import main; main()"]


def env(tmp: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH")]))
    e["XDG_CONFIG_HOME"] = str(tmp / "xdg-config")  # no user config leaks in
    e["XDG_DATA_HOME"] = str(tmp / "xdg-data")
    return e


def cmd(*args: str) -> list[str]:
    return [sys.executable, *ENTRY, *args]


def run(tmp: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd(*args), capture_output=True, text=True, env=env(tmp), cwd=tmp, timeout=timeout)


def start(tmp: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(tmp),
                            cwd=tmp)


def query(db: Path, sql: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(db, timeout=10)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def free_ports(n: int) -> list[int]:
    """`n` distinct 127.0.0.1 ports free now. They are held together while picked: a port picked alone and let
    go can be picked again at once, before the process it was for binds it (a fleet test once started two
    boxes on one port when the machine was busy)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()

