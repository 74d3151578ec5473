"""Files gpudash writes are the operator's alone: directories it creates are 0700, files 0600.

The DB, server logs and exports can hold prompts, paths and host details; nothing else on the box needs
to read them. A directory that already exists keeps its mode (the operator chose it); a file gpudash owns
is set to 0600 whether it creates it or finds it.
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
    """Make sure `path` exists as a 0600 file (created empty if missing); OSError if it cannot be created."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))
    except FileExistsError:
        with contextlib.suppress(OSError):  # not ours to change (another's file, a read-only filesystem)
            os.chmod(path, FILE_MODE)
    return path
