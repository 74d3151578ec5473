"""Where a server's output goes: one log file per gpudash instance and server, and a link to the newest.

Two gpudash processes may supervise servers of the same name into the same log directory (a dashboard and
a `serve`, or two boxes sharing a home directory); one file for both would interleave their lines. So an
instance writes `<name>.<start time>-<pid>-<n>.log` (every launch of that server by the instance appends to
it, under a `=== gpudash ...` header), and `<name>.log` is a symlink to the newest such file, for
`tail -F`. A regular `<name>.log` left by an older gpudash is kept, renamed after its last change.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

_instances = itertools.count(1)  # two supervisors of one process (tests, a relaunched stack) never share a file


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
