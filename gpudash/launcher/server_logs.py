"""Where a server's output goes: one log file per gpudash instance and server, and a link to the newest.

Two gpudash processes may supervise servers of the same name into the same log directory (a dashboard and
a `serve`, or two boxes sharing a home directory); one file for both would interleave their lines. So an
instance writes `<name>.<start time>-<pid>-<n>.log` (every launch of that server by the instance appends to
it, under a `=== gpudash ...` header), and `<name>.log` is a symlink to the newest such file, for
`tail -F`. A regular `<name>.log` left by an older gpudash is kept, renamed after its last change.

Each launch prunes the server's older instance logs to the newest KEEP_PER_SERVER, so a box that runs
gpudash for months does not fill its disk; a log that another live instance may still be writing is kept,
and so is a renamed `<name>.log` (gpudash may not have written it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
from pathlib import Path

import psutil

_instances = itertools.count(1)  # two supervisors of one process (tests, a relaunched stack) never share a file

KEEP_PER_SERVER = 10  # instance logs kept per server name: the last ten runs' output


def instance_log(log_dir: Path, name: str, started: float | None = None) -> Path:
    """This instance's log file for server `name` (not created here)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started or time.time()))
    return Path(log_dir) / f"{name}.{stamp}-{os.getpid()}-{next(_instances)}.log"


def latest_link(log_dir: Path, name: str) -> Path:
    return Path(log_dir) / f"{name}.log"


def point_latest(log: Path, name: str) -> None:
    """Make `<name>.log` beside `log` a symlink to it (replaced in one step: a reader never finds no link).
    The link is a convenience: a failure to make it is ignored."""
    link = latest_link(log.parent, name)
    with contextlib.suppress(OSError):
        if link.exists() and not link.is_symlink():  # an older gpudash's single log: kept, not overwritten
            kept = time.strftime("%Y%m%d-%H%M%S", time.localtime(link.stat().st_mtime))
            link.rename(link.with_name(f"{name}.{kept}.log"))
        tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(log.name)
        os.replace(tmp, link)


def prune_old(log_dir: Path, name: str, keep: int = KEEP_PER_SERVER) -> list[Path]:
    """Delete all but the newest `keep` instance logs of server `name` (by last change): regular files named
    `<name>.<stamp>-<pid>-<n>.log`, as instance_log names them. A renamed `<name>.<stamp>.log` may be a file
    gpudash did not write, and stays. A log whose pid is alive stays (another instance may be writing it).
    Returns what was deleted; an error leaves the file."""
    ours = re.compile(rf"{re.escape(name)}\.\d{{8}}-\d{{6}}-(\d+)-\d+\.log")
    logs: list[tuple[float, Path, int]] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(log_dir):
            match = ours.fullmatch(entry.name)
            with contextlib.suppress(OSError):
                if match and entry.is_file(follow_symlinks=False):
                    logs.append((entry.stat(follow_symlinks=False).st_mtime, Path(entry.path), int(match.group(1))))
    logs.sort(key=lambda log: log[0], reverse=True)
    gone = []
    for _, path, pid in logs[keep:]:
        if psutil.pid_exists(pid):
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            gone.append(path)
    return gone

