"""Helpers the hostile tests share: the gpudash CLI as a real process with its own user directories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ENTRY = ["-c", "from gpudash.cli import main; main()"]


def gpudash(*args: str, home: Path, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the gpudash CLI in a fresh interpreter with its user dirs under `home`."""
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_DATA_HOME": str(home / "data"), "XDG_STATE_HOME": str(home / "state"),
           "XDG_CACHE_HOME": str(home / "cache")}
    return subprocess.run([sys.executable, *ENTRY, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, **kw)
