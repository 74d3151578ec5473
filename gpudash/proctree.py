"""A process's descendants, found without scanning every process on the box.

psutil's `children(recursive=True)` reads /proc/*/stat of every process to build a parent map: on a box
with 200 processes that cost gpudash 1.3% of a core per asker at a 1 s refresh (three sources ask each
tick). Linux lists each thread's children in /proc/PID/task/TID/children, so walking down from the root
reads only the tree's own threads. Where the kernel lacks that file (CONFIG_PROC_CHILDREN off), psutil's
scan is the fallback.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

PROC = Path("/proc")


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
