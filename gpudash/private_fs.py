"""Files gpudash writes are the operator's alone: directories it creates are 0700, files 0600.

The DB, server logs and exports can hold prompts, paths and host details; nothing else on the box needs
to read them. Modes are set only at creation, on what gpudash itself creates: a directory or file that
already exists keeps its mode (the operator chose it, or it is not gpudash's at all: a `--db` that turns
out not to be a database, or a symlink to some other file), and nothing is ever changed through a symlink.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


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
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE))
    return path
