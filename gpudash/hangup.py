"""A hang-up (SIGHUP: the ssh session or the terminal went away) stops record, serve and launch like
SIGTERM, and what they print while stopping must not fail on the terminal that is gone.
"""

from __future__ import annotations

import os
import stat


def silence_gone_terminal() -> None:
    """Point stdout and stderr, where they are a terminal, at /dev/null. After a hang-up every write to the
    terminal fails (EIO), so a shutdown that prints its summary would end in a traceback and exit 1
    after doing everything right. A pipe or a file (systemd's journal, a redirect) keeps its output.
    A terminal is told by its file type (a character device): isatty() answers no once it has hung up.
    Safe in a signal handler."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                terminal = stat.S_ISCHR(os.fstat(fd).st_mode)
            except OSError:  # closed
                continue
            if terminal:
                os.dup2(null, fd)
    finally:
        os.close(null)
