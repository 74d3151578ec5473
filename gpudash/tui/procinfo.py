"""Who runs a process and with which command, looked up once per pid with psutil for the Processes tab
(nvitop's USER and COMMAND columns: the program's name, then its arguments, where the whole path of a
virtual environment's python filled the column). Only on a live rig: a recording's pids are gone or
reused by now. Called on a worker thread (reading /proc can block on a hung mount); no textual here."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class ProcInfo:
    user: str  # the owner's name, or the uid where the name is unknown
    command: str  # the program's name and its arguments (nvitop's COMMAND), or the process name
    mine: bool  # owned by the user gpudash runs as (root owns everything)
    started: float | None = None  # psutil's create_time: with the pid, which process this is
    program: str = ""  # where the program is (argv[0] as it was run: /tmp/x/.venv/bin/python)


GONE = ProcInfo("", "", False)  # the process exited before it was looked up


def lookup(pids: list[int]) -> dict[int, ProcInfo]:
    """ProcInfo for each pid (GONE for a pid that no longer exists)."""
    me = os.getuid()
    found = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                uid = proc.uids().real
                try:
                    user = proc.username()
                except (KeyError, psutil.Error):  # no passwd entry (containers)
                    user = str(uid)
                try:
                    argv = proc.cmdline()
                except psutil.AccessDenied:
                    argv = []
                command = shlex.join([os.path.basename(argv[0]) or argv[0], *argv[1:]]) if argv else proc.name()
                started = proc.create_time()
        except psutil.NoSuchProcess:
            found[pid] = GONE
            continue
        except psutil.Error:
            found[pid] = ProcInfo("?", "?", False)
            continue
        found[pid] = ProcInfo(user, command, me == 0 or uid == me, started, argv[0] if argv else "")
    return found
