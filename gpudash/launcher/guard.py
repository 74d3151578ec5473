"""Servers die with gpudash, even when gpudash is killed (SIGKILL, SIGHUP from a closed terminal), and
even when a server ignores SIGTERM or has children of its own.

Servers run in their own process group (so a stop takes their workers along), which also means nothing
ends them when gpudash dies without cleaning up. On Linux each server is started through a shim: this
file, run as a script in a fresh interpreter (`-S`, stdlib only), never as Python code in a forked child
of gpudash. The shim
1. sets PR_SET_PDEATHSIG (SIGTERM when gpudash goes; it survives the exec, so the server gets it at once);
2. starts a keeper: a small process in the server's group, nobody's child, that waits for gpudash or the
   server to end, whichever comes first (when gpudash is killed the server often dies of its death
   signal at the same moment, so the order tells nothing). Then it sends SIGTERM to the whole group,
   waits up to a grace period for the group's other members to go, then SIGKILL: a server that ignores
   SIGTERM goes too, and so do its children, also those of a server that crashed or was stopped;
3. execs the server, keeping the pid, so gpudash sees the server's own pid and exit status.
The death signal is tied to the parent *thread*, so every server is spawned from one long-lived thread.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

# Exit status of the shim when gpudash was already gone before the server could be started.
PARENT_GONE = 70
# Seconds a server gets between SIGTERM and SIGKILL once gpudash has died.
GRACE_S = 5.0
_POLL_S = 0.5  # liveness poll where pidfds are not available (Linux < 5.3)


def guarded(argv: Sequence[str], grace_s: float = GRACE_S) -> list[str]:
    """`argv` wrapped so the server and its process group end when gpudash dies (unchanged off Linux)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-S", os.path.abspath(__file__), str(os.getpid()), repr(float(grace_s)), *argv]


def _shim(parent: int, grace_s: float, argv: list[str]) -> int:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:
        return PARENT_GONE
    server = os.getpid()
    first = os.fork()
    if first == 0:  # a child that starts the keeper and leaves at once, so the keeper is nobody's child
        if os.fork() == 0:
            _keep(parent, server, grace_s)
        os._exit(0)
    os.waitpid(first, 0)
    os.execvp(argv[0], argv)
    return 127  # not reached: execvp raises when it fails


def _keep(parent: int, server: int, grace_s: float) -> None:
    """The keeper's life: nothing while both live; when either goes, the server's whole group goes."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a stop's SIGTERM is for the server
        signal.signal(sig, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # no hold on the server's log pipe
        os.dup2(null, fd)
    first = _first_to_end(parent, server, None)
    if os.getpgrp() == server:  # the server leads its group (as gpudash starts it): all of it goes
        _end_group(server, grace_s)
    elif first == parent:  # started without a group of its own: only the server, and only for gpudash
        _signal_group(server, signal.SIGTERM)
        _first_to_end(server, server, grace_s)
        _signal_group(server, signal.SIGKILL)
    os._exit(0)


def _end_group(pgid: int, grace_s: float) -> None:
    """SIGTERM to the group, up to `grace_s` for its members other than this keeper to end, then SIGKILL
    (the server if still there, its children, and this keeper). The group's id cannot be reused by a new
    process meanwhile: the keeper's own membership keeps it taken."""
    import time

    _signal_group(pgid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while _others_in_group(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)


def _others_in_group(pgid: int) -> bool:
    """Whether a live process other than this one is in process group `pgid` (zombies do not count)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _first_to_end(a: int, b: int, timeout_s: float | None) -> int | None:
    """Which of two processes ended first (None on timeout)."""
    import select
    import time

    try:
        fds = {os.pidfd_open(a): a, os.pidfd_open(b): b}
    except (AttributeError, OSError):  # no pidfds: poll
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while end is None or time.monotonic() < end:
            for pid in (a, b):
                if not _alive(pid):
                    return pid
            time.sleep(_POLL_S)
        return None
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    ready = poller.poll(None if timeout_s is None else int(timeout_s * 1000))
    return fds[ready[0][0]] if ready else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pgid, sig)  # not a group leader (started without a session of its own)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    sys.exit(_shim(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]))
