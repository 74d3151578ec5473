"""Servers die with gpudash, even when gpudash is killed (SIGKILL, SIGHUP from a closed terminal).

Servers run in their own process group (so a stop takes their workers along), which also means nothing
ends them when gpudash dies without cleaning up. On Linux the server is started through a tiny shim that
sets PR_SET_PDEATHSIG (SIGTERM when its parent goes) and then execs the server, keeping the pid. The
signal is tied to the parent *thread*, so every server is spawned from one long-lived spawner thread.
The shim runs in a fresh interpreter (`-S`, stdlib only), never as Python code in a forked child.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# Exit status of the shim when gpudash was already gone before the server could be started.
PARENT_GONE = 70

_SHIM = ("import ctypes,os,signal,sys;"
         "ctypes.CDLL(None,use_errno=True).prctl(1,signal.SIGTERM);"  # 1 = PR_SET_PDEATHSIG
         f"os.getppid()==int(sys.argv[1]) or sys.exit({PARENT_GONE});"
         "os.execvp(sys.argv[2],sys.argv[2:])")


def guarded(argv: Sequence[str]) -> list[str]:
    """`argv` wrapped so the process gets SIGTERM when gpudash dies (unchanged off Linux)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-S", "-c", _SHIM, str(os.getpid()), *argv]
