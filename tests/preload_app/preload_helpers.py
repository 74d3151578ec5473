"""Helpers the preload tests share: process_side.c driven line by line, and block clean-up."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpudash.preload import shm as P


class ProcessSide:
    """process_side.c running: one command line in, one answer line out."""

    def __init__(self, program: Path, name: str = "") -> None:
        env = {**os.environ, P.NAME_ENV: name}
        self.proc = subprocess.Popen([str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, bufsize=1)
        ready = self.proc.stdout.readline().split()
        assert ready[:1] == ["ready"], f"process_side did not start: {ready}"
        self.pid = int(ready[1])

    def cmd(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def end(self, how: str = "quit") -> int:
        if self.proc.poll() is None:
            self.proc.stdin.write(how + "\n")
            self.proc.stdin.flush()
        return self.proc.wait(timeout=30)


def remove_blocks(pid: int) -> None:
    for prefix in (P.STATS_PREFIX, P.KNOBS_PREFIX):
        (P.SHM_DIR / f"{prefix}{pid}").unlink(missing_ok=True)


def wait_for_block(pid: int, timeout_s: float = 30.0) -> None:
    """Until process `pid` has published its stats block (the limit only turns a hang into a failure)."""
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            P.StatsView(pid).close()
            return
        except P.BlockUnavailable:
            time.sleep(0.01)
    raise AssertionError(f"process {pid} published no stats block within {timeout_s} s")
