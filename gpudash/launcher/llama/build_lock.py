"""One llama-server build per cache and tag at a time, each with a log of its own.

Two builds into one cache folder (the dashboard's background build and `gpudash llama build` from a second
clone) would replace each other's source and overwrite each other's log. A build holds an exclusive
`flock` on `<cache>/llama-server/.build/<tag>.lock` while it unpacks, configures and compiles; the lock file
names the holder's pid and log, so a second build waits, shows the first one's progress from that log,
and then uses its result. The kernel drops the lock when its holder dies, so a killed build never blocks
the next one. Logs are `.build/logs/<tag>-<UTC time to the microsecond>-<pid>.log`, the newest KEEP_LOGS of a tag kept.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

KEEP_LOGS = 10
POLL_S = 1.0
_TAIL_BYTES = 8192  # the end of the holder's log, where its latest progress line is


@dataclass(frozen=True, slots=True)
class Holder:
    """The build that holds the lock: its pid and log (None when it has not said yet)."""

    pid: int | None
    log: Path | None


Waiting = Callable[[Holder, tuple[int, int] | None], None]  # told every POLL_S while another build runs


def new_log(work_root: Path, tag: str) -> Path:
    """The name of this build's own log (written once it holds the lock)."""
    now = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    return work_root / "logs" / f"{tag}-{now}-{os.getpid()}.log"


def _prune_logs(log: Path, tag: str) -> None:
    """Make room for `log`: the oldest logs of `tag` beyond KEEP_LOGS - 1 go (called under the lock)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    for old in sorted(log.parent.glob(f"{tag}-*.log"))[:-(KEEP_LOGS - 1)]:
        old.unlink(missing_ok=True)


def _holder(fd: int) -> Holder:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return Holder(int(data["pid"]), Path(data["log"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Holder(None, None)


def last_progress(log: Path | None, parse: Callable[[str], tuple[int, int] | None]) -> tuple[int, int] | None:
    """The latest (done, total) in the end of a build's log, or None."""
    if log is None:
        return None
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    return next((step for line in reversed(lines) if (step := parse(line)) is not None), None)


@contextmanager
def build_lock(work_root: Path, tag: str, log: Path, waiting: Waiting | None,
               parse: Callable[[str], tuple[int, int] | None]) -> Iterator[bool]:
    """Hold the build lock of `tag` for the body, naming this build's `log` in it; yields whether another
    build held it first (its result may be there now). `waiting` may raise to give up waiting."""
    work_root.mkdir(parents=True, exist_ok=True)
    fd = os.open(work_root / f"{tag}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = True
                holder = _holder(fd)
                if waiting is not None:
                    waiting(holder, last_progress(holder.log, parse))
                time.sleep(POLL_S)
        _prune_logs(log, tag)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "log": str(log)}).encode(), 0)
        yield waited
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def running_builds(work_root: Path) -> list[Holder]:
    """The builds holding a lock in `work_root` now (this process's own included), as they named themselves."""
    out = []
    for path in sorted(work_root.glob("*.lock")) if work_root.is_dir() else ():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            out.append(_holder(fd))
        except OSError:
            pass
        finally:
            os.close(fd)
    return out
