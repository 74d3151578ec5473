"""The figure gpudash shows for its own CPU equals what its process used: each tick's value against the
CPU time the kernel counted for every thread of this process (/proc/self/task/*/schedstat, nanoseconds)
over the same window. /proc's per-process ticks are 10 ms, so at a 0.25 s window a reading built on them
moves in steps of 4% of a core; a thread here burns 13% to sit between two steps."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gpudash.telemetry.host import HostSource

WINDOW_S = 0.25
BURN_S = 0.0325  # 13% of one core per window


def _cpu_ns() -> int:
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            pass
    return total


def test_own_cpu_equals_what_the_process_used() -> None:
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            start = time.thread_time()
            while time.thread_time() - start < BURN_S:
                pass
            stop.wait(WINDOW_S - BURN_S)

    burner = threading.Thread(target=burn, daemon=True)
    burner.start()
    source = HostSource()
    try:
        source.poll()
        errors = []
        for _ in range(8):
            t0, c0 = time.monotonic(), _cpu_ns()
            source.poll()
            time.sleep(WINDOW_S)
            t1, c1 = time.monotonic(), _cpu_ns()
            shown = source.poll()["host"].gpudash_cpu_pct
            truth = (c1 - c0) / 1e9 / (t1 - t0) * 100
            errors.append(abs(shown - truth))
    finally:
        stop.set()
        burner.join()
    assert max(errors) < 1.0, errors  # percentage points of one core
