"""Where a server's output goes: one log file per gpudash instance and server, and a link to the newest.

Two gpudash processes may supervise servers of the same name into the same log directory (a dashboard and
a `serve`, or two boxes sharing a home directory); one file for both would interleave their lines. So an
instance writes `<name>.<start time>-<pid>-<n>.log` (every launch of that server by the instance appends to
it, under a `=== gpudash ...` header), and `<name>.log` is a symlink to the newest such file, for
`tail -F`. A regular `<name>.log` left by an older gpudash is kept, renamed after its last change.

A log's name is predictable, so another local user could plant a symlink there and have gpudash write the
server's output into a file of theirs (or root's). Logs live only in a directory no other user can write,
and are created with O_EXCL|O_NOFOLLOW: a name already taken is passed over, never followed.

A log is rotated by size (`[logs] server_max_bytes`): once it holds that much, its lines so far become
`<log>.1` (replacing the one before) and the log starts afresh under a `=== gpudash` header, so a server
that prints without end holds at most twice the limit on disk.

Each launch prunes the server's older instance logs to the newest KEEP_PER_SERVER, so a box that runs
gpudash for months does not fill its disk. Only what gpudash wrote is deleted: regular files of this user,
named as instance_log names them (ASCII digits), that begin with gpudash's header and are not dated in the
future; a log that another live instance may still be writing is kept, and so is a renamed `<name>.log`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import stat
import time
from pathlib import Path
from typing import TextIO

import psutil

from gpudash.private_fs import FILE_MODE, private_dir, symlink_atomic

_instances = itertools.count(1)  # two supervisors of one process (tests, a relaunched stack) never share a file

KEEP_PER_SERVER = 10  # instance logs kept per server name: the last ten runs' output
HEADER = b"=== gpudash "  # how every log gpudash writes begins (the launch header)
FUTURE_SLACK_S = 300.0  # a log changed further ahead than this was not written by gpudash just now
_TRIES = 100  # fresh names tried when the one picked is taken
ROTATED = ".1"  # the suffix of a log's older part
DEFAULT_MAX_BYTES = 64 << 20  # [logs] server_max_bytes when nothing sets it


class LogDirError(OSError):
    """A log directory gpudash will not write into (another user can write it); the message says why."""


def instance_log(log_dir: Path, name: str, started: float | None = None) -> Path:
    """This instance's log file for server `name` (not created here)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started or time.time()))
    return Path(log_dir) / f"{name}.{stamp}-{os.getpid()}-{next(_instances)}.log"


def latest_link(log_dir: Path, name: str) -> Path:
    return Path(log_dir) / f"{name}.log"


def check_private(log_dir: Path) -> None:
    """LogDirError unless `log_dir` (created 0700 when missing) belongs to this user and no other can write
    into it."""
    private_dir(log_dir)
    st = os.stat(log_dir)
    if st.st_uid != os.geteuid():
        raise LogDirError(f"the server log directory {log_dir} belongs to uid {st.st_uid}, not to you (uid "
                          f"{os.geteuid()}); point gpudash at a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise LogDirError(f"the server log directory {log_dir} can be written by other users (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}), who could plant links where server logs go; "
                          f"run `chmod go-w {log_dir}`")


def open_log(log_dir: Path, name: str, path: Path, made: bool) -> tuple[Path, TextIO]:
    """This instance's log of server `name`, opened for appending, and its path. `made`: this instance
    created `path` at an earlier launch, so it is reopened (O_NOFOLLOW, and only while it is still a regular
    file of this user); otherwise a new file is created with O_EXCL|O_NOFOLLOW, at `path` or, when that name
    is taken (planted), at a fresh one. OSError (LogDirError for an unsafe directory) when impossible."""
    check_private(log_dir)
    if made:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # removed, or replaced by a link (ELOOP) or a FIFO (ENXIO) since: a new one
            pass
        else:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                return path, _text(fd)
            os.close(fd)
    for _ in range(_TRIES):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         FILE_MODE)
        except FileExistsError:
            path = instance_log(log_dir, name)
            continue
        return path, _text(fd)
    raise FileExistsError(f"every log name tried in {log_dir} was taken")


class RotatingLog:
    """A server's open log that rotates itself at `max_bytes` (see the module's docstring); `path` is the
    file written now. Used by one reader thread."""

    def __init__(self, log_dir: Path, name: str, path: Path, file: TextIO, max_bytes: int) -> None:
        self.log_dir, self.name, self.path, self._file, self.max_bytes = Path(log_dir), name, path, file, max_bytes
        self._size = os.fstat(file.fileno()).st_size

    def write(self, text: str) -> None:
        self._file.write(text)
        self._file.flush()
        self._size += len(text)
        if self._size >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        """The lines so far to `<path>.1`, a fresh file at `path` (or, if that name is taken, a new one, which
        the latest link then names). A failure keeps writing where it was: a log is never worth a server."""
        try:
            check_private(self.log_dir)
            os.replace(self.path, self.path.with_name(self.path.name + ROTATED))
            path, file = open_log(self.log_dir, self.name, self.path, made=False)
        except OSError:
            self._size = 0  # try again after another max_bytes
            return
        self._file.close()
        self.path, self._file, self._size = path, file, 0
        self.write(f"{HEADER.decode()}{time.strftime('%Y-%m-%d %H:%M:%S')}: rotated at {self.max_bytes} bytes; "
                   f"the lines before are in {self.path.name}{ROTATED}\n")
        point_latest(path, self.name)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RotatingLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def header_line(command: str) -> str:
    """The line a launch begins its part of the log with: the time and the command line (masked)."""
    return f"{HEADER.decode()}{time.strftime('%Y-%m-%d %H:%M:%S')}: {command}\n"


def _text(fd: int) -> TextIO:
    return open(fd, "a", encoding="utf-8", errors="replace")


def point_latest(log: Path, name: str) -> None:
    """Make `<name>.log` beside `log` a symlink to it (replaced in one step: a reader never finds no link).
    A regular `<name>.log` of this user (an older gpudash's single log) is renamed, not overwritten;
    anything else by that name (a directory, another user's file) stays as it is, without a link. The link
    is a convenience: a failure to make it is ignored."""
    link = latest_link(log.parent, name)
    with contextlib.suppress(OSError):
        st = link.lstat()
        if not stat.S_ISLNK(st.st_mode):
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return
            kept = time.strftime("%Y%m%d-%H%M%S", time.localtime(st.st_mtime))
            link.rename(link.with_name(f"{name}.{kept}.log"))
    with contextlib.suppress(OSError):
        symlink_atomic(link, log.name)


def prune_old(log_dir: Path, name: str, keep: int = KEEP_PER_SERVER) -> list[Path]:
    """Delete all but the newest `keep` instance logs of server `name` (by last change), of those gpudash
    wrote (`_ours`). A renamed `<name>.<stamp>.log` may be a file gpudash did not write, and stays. A log
    whose pid is alive stays (another instance may be writing it). Returns what was deleted; an error
    leaves the file."""
    named = re.compile(rf"{re.escape(name)}\.[0-9]{{8}}-[0-9]{{6}}-([0-9]{{1,10}})-[0-9]{{1,10}}\.log", re.ASCII)
    logs: list[tuple[float, Path, int]] = []
    latest = time.time() + FUTURE_SLACK_S
    with contextlib.suppress(OSError):
        for entry in os.scandir(log_dir):
            match = named.fullmatch(entry.name)
            with contextlib.suppress(OSError):
                if match and _ours(entry, latest):
                    logs.append((entry.stat(follow_symlinks=False).st_mtime, Path(entry.path), int(match[1])))
    logs.sort(key=lambda log: log[0], reverse=True)
    gone = []
    for _, path, pid in logs[keep:]:
        if psutil.pid_exists(pid):
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            gone.append(path)
        older = path.with_name(path.name + ROTATED)  # its rotated part, if it is a file of this user
        with contextlib.suppress(OSError):
            st = older.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                older.unlink()
                gone.append(older)
    return gone


def _ours(entry: os.DirEntry, latest: float) -> bool:
    """Whether a log-named entry is a log gpudash wrote: a regular file of this user, not dated after
    `latest` (a file set in the future would push the real logs out), that begins with the header."""
    st = entry.stat(follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mtime > latest:
        return False
    fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return os.read(fd, len(HEADER)) == HEADER
    finally:
        os.close(fd)
