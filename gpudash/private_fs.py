"""Files gpudash writes are the operator's alone, and names it did not create are never followed.

Directories it creates are 0700, files 0600.
The DB, server logs and exports can hold prompts, paths and host details; nothing else on the box needs
to read them. Modes are set only at creation, on what gpudash itself creates: a directory or file that
already exists keeps its mode (the operator chose it, or it is not gpudash's at all: a `--db` that turns
out not to be a database, or a symlink to some other file), and nothing is ever changed through a symlink.

Every file gpudash writes or replaces in a directory it does not own goes through `write_atomic` (or
`Pending` where a file is streamed, `symlink_atomic` for a link): a new file under an unpredictable name,
created O_EXCL|O_NOFOLLOW with its mode, fsynced, renamed into place, the directory fsynced; a fixed
temporary name (`.NAME.PID.tmp`) would let another user plant a link there and have gpudash write through
it. What gpudash reads from such a place goes through `read_capped`: O_NOFOLLOW|O_NONBLOCK, a regular file
only, a size cap (a FIFO would hang the read, a link to /dev/zero would grow memory without end).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TRIES = 100  # fresh names tried when one is taken (64 random bits: never, unless planted by guessing)


def private_dir(path: Path) -> Path:
    """Create `path` and its missing parents as 0700; OSError if that is impossible."""
    missing = []
    p = Path(path)
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create `path` as an empty 0600 file unless something (a file, a symlink, even a dangling one)
    already has that name, which is left as it is; OSError if it cannot be created."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, _NEW_FILE, FILE_MODE))
    return path


class UnsafeFileError(OSError):
    """A file gpudash will not read or replace as it stands (a link, a FIFO, a device, too large); the
    message is one sentence naming the file and what it is (also its `strerror`, as callers of OSError read)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.strerror = message


def _open_dir(path: Path) -> int:
    return os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


class Pending:
    """A new file beside `target` under an unpredictable name, created O_EXCL|O_NOFOLLOW with its final
    mode, so a name planted in advance (a link, a FIFO) is never opened. Write through `file` (or, for a
    library that insists on a file name, through `name_for_library`, which is this open file and nothing
    else); `commit()` puts it in place, `discard()` removes it. All of it goes through one directory fd, so
    a directory swapped half-way changes nothing."""

    def __init__(self, target: Path, mode: int = FILE_MODE) -> None:
        self.target = Path(target)
        self._dir = _open_dir(self.target)
        try:
            for _ in range(_TRIES):
                self._name = f".{self.target.name}.{secrets.token_hex(8)}.tmp"
                try:
                    fd = os.open(self._name, _NEW_FILE, mode, dir_fd=self._dir)
                except FileExistsError:
                    continue
                break
            else:
                raise FileExistsError(f"every temporary name tried beside {self.target} was taken")
            os.fchmod(fd, mode)  # the umask does not narrow or widen what was asked
        except BaseException:
            os.close(self._dir)
            raise
        self.file = open(fd, "wb")

    @property
    def name_for_library(self) -> str:
        """A name that opens this very file (the open descriptor's /proc entry), for libraries that open by
        name (gguf, pyarrow)."""
        return f"/proc/self/fd/{self.file.fileno()}"

    def commit(self) -> Path:
        """fsync the file, rename it over the target (whatever the target is: a link is replaced, never
        followed), fsync the directory. UnsafeFileError if the temporary name no longer holds this file
        (someone renamed another into its place), and then nothing is renamed."""
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            mine, there = os.fstat(self.file.fileno()), os.stat(self._name, dir_fd=self._dir, follow_symlinks=False)
            if (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino):
                raise UnsafeFileError(f"{self.target.parent / self._name} was replaced while gpudash wrote it; "
                                      f"{self.target} was left as it was")
            os.replace(self._name, self.target.name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
            os.fsync(self._dir)
        except BaseException:
            self.discard()
            raise
        self._close()
        return self.target

    def discard(self) -> None:
        """Remove the temporary file (if it is still ours) and close everything; safe to call twice."""
        if self._dir < 0:
            return
        with contextlib.suppress(OSError):
            mine, there = os.fstat(self.file.fileno()), os.stat(self._name, dir_fd=self._dir, follow_symlinks=False)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                os.unlink(self._name, dir_fd=self._dir)
        self._close()

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
        os.close(self._dir)
        self._dir = -1

    def __enter__(self) -> Pending:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def write_atomic(path: Path, data: bytes | str, mode: int = FILE_MODE,
                 owner: tuple[int, int] | None = None) -> Path:
    """Make `data` (str as UTF-8) the whole content of `path`: a reader sees the old file or the new one,
    never half of one, and nothing already at `path` or at any name beside it is followed or written
    through. `owner` (uid, gid) is given to the new file (root writing a user's file)."""
    with Pending(path, mode) as new:
        new.file.write(data.encode("utf-8") if isinstance(data, str) else data)
        if owner is not None:
            os.fchown(new.file.fileno(), *owner)
    return Path(path)


def symlink_atomic(path: Path, to: str) -> Path:
    """Make `path` a symlink to `to` in one step (a reader never finds no link): made under an unpredictable
    name beside it, then renamed over whatever `path` was."""
    path = Path(path)
    dirfd = _open_dir(path)
    try:
        for _ in range(_TRIES):
            tmp = f".{path.name}.{secrets.token_hex(8)}.tmp"
            try:
                os.symlink(to, tmp, dir_fd=dirfd)  # never follows: fails on any name already there
            except FileExistsError:
                continue
            try:
                os.replace(tmp, path.name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dirfd)
                raise
            return path
        raise FileExistsError(f"every temporary name tried beside {path} was taken")
    finally:
        os.close(dirfd)


def read_capped(path: Path, limit: int) -> bytes:
    """The content of the regular file at `path`, of at most `limit` bytes. It is opened O_NOFOLLOW|
    O_NONBLOCK, so a link or a FIFO planted there neither redirects nor blocks the read; UnsafeFileError
    (one sentence naming the file) for a link, anything but a regular file, or a larger file.
    FileNotFoundError and other OSErrors as the system gives them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeFileError(f"{path} is a symlink, and gpudash reads only a regular file there; "
                                  "put the file itself there") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFileError(f"{path} is not a regular file (a FIFO, device or directory), so "
                                  "gpudash does not read it; remove it or use another name")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnsafeFileError(f"{path} is larger than the {limit} bytes gpudash reads from such a "
                              "file; remove it or use another name")
    return data
