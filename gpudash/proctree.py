"""A process's descendants, found without scanning every process on the box; what a started program
spawned, found even after it left its group and its parent; and whose listener a port is.

psutil's `children(recursive=True)` reads /proc/*/stat of every process to build a parent map: on a box
with 200 processes that cost gpudash 1.3% of a core per asker at a 1 s refresh (three sources ask each
tick). Linux lists each thread's children in /proc/PID/task/TID/children, so walking down from the root
reads only the tree's own threads. Where the kernel lacks that file (CONFIG_PROC_CHILDREN off), psutil's
scan is the fallback.

A program that forks, lets the child leave its session (setsid) and exits leaves that child under init,
where neither a process group nor the tree finds it. So whatever gpudash starts carries a random tag in its
environment (`tagged_env`), which every descendant inherits, and `tagged` finds them all by it. A port counts
as a started server's only when the listening socket on it is held by that server or its descendants
(`listens`): a port squatter that answers /health first is not the server.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import Mapping
from pathlib import Path

import psutil

PROC = Path("/proc")
TAG = "GPUDASH_SPAWN"  # the environment variable that marks what one start of a program spawned


def _children_files_exist() -> bool:
    return (PROC / str(os.getpid()) / "task" / str(os.getpid()) / "children").exists()


CHILDREN_FILES = _children_files_exist()


def _children(pid: int) -> list[int]:
    """Direct children of every thread of `pid` ([] once it is gone)."""
    try:
        tasks = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tasks:
        try:
            out.extend(int(c) for c in (PROC / str(pid) / "task" / tid / "children").read_text().split())
        except OSError:  # the thread ended meanwhile
            continue
    return out


def descendants(pid: int) -> list[int]:
    """The pids of every process below `pid` (children, theirs, ...); [] when it has none or is gone."""
    if not CHILDREN_FILES:
        try:
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop())
        out.extend(kids)
        todo.extend(kids)
    return out


def tagged_env(env: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """`env` with a fresh spawn tag, and the tag: pass it to `tagged`/`end_tagged` to find everything the
    program started with this environment spawned."""
    tag = secrets.token_hex(12)
    return {**env, TAG: tag}, tag


def tagged(tag: str) -> list[int]:
    """The pids of this user's processes whose environment carries `tag` (another user's are unreadable,
    and never ours). A scan of /proc: done when a program ends, not on every tick."""
    if not tag:
        return []
    marker = f"{TAG}={tag}".encode()
    me, out = os.getpid(), []
    for entry in os.listdir(PROC):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(PROC / entry / "environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:  # gone, or not ours
            continue
    return out


def end_tagged(tag: str) -> list[int]:
    """SIGKILL every process carrying `tag` (see `tagged`); returns whom it signalled. For what is left once
    a program's own stop (TERM, the grace period, its group's KILL) is over."""
    hit = []
    for pid in tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
            hit.append(pid)
        except OSError:
            continue
    return hit


def listens(pid: int, port: int) -> bool:
    """Whether `pid` or one of its descendants holds a TCP socket listening on `port`."""
    for p in (pid, *descendants(pid)):
        try:
            conns = psutil.Process(p).net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return False


def run_bounded(argv: list[str], limit: int, timeout_s: float) -> tuple[int | None, bytes]:
    """Run `argv` (stdin from /dev/null, stdout and stderr together) and return (exit code, output): at most
    `limit` bytes are read and at most `timeout_s` waited, then the program and everything it spawned end
    (its group, while its unreaped pid still holds the group id, and what left the group: `end_tagged`).
    The exit code is None when it was cut short. OSError when it cannot be started."""
    import select
    import subprocess
    import time

    env, tag = tagged_env(os.environ)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    assert proc.stdout is not None
    out, end, exited = bytearray(), time.monotonic() + timeout_s, False
    try:
        pidfd = os.pidfd_open(proc.pid)
        try:
            while len(out) <= limit and (left := end - time.monotonic()) > 0:
                if select.select([proc.stdout], [], [], left)[0]:
                    chunk = os.read(proc.stdout.fileno(), min(1 << 16, limit + 1 - len(out)))
                    if not chunk:  # its output is closed: give it what is left of the time to exit
                        exited = bool(select.select([pidfd], [], [], max(0.0, end - time.monotonic()))[0])
                        break
                    out += chunk
        finally:
            os.close(pidfd)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: the group id is still its own
        end_tagged(tag)
        proc.stdout.close()
        rc = proc.wait()
    return (rc if exited and len(out) <= limit else None), bytes(out[:limit])
