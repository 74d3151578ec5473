"""Host source: psutil values and per-PID CPU/RSS of a real child process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpudash.telemetry.host import HostSource, numa_node_count

BUSY = "import time\nend = time.time() + 20\nx = bytearray(64 * 2**20)\nwhile time.time() < end: pass\n"


def test_per_pid_cpu_and_rss_of_a_real_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        watched = {child.pid: "busy-server"}
        src = HostSource(pids=lambda: dict(watched))
        src.poll()
        time.sleep(0.5)
        out = src.poll()
        host = out["host"]
        assert host.mem_total > host.mem_used > 0 and 0 <= host.cpu_pct <= 100
        assert host.gpudash_rss > 0 and host.gpudash_cpu_pct is not None
        assert host.numa_nodes is None or host.numa_nodes >= 1
        (proc,) = out["processes"]
        assert proc.pid == child.pid and proc.name == "busy-server"
        assert proc.cpu_pct > 20  # a busy loop; the box is shared, so not ~100
        assert proc.rss > 64 * 2**20
    finally:
        child.kill()
        child.wait()
    (gone,) = src.poll()["processes"]
    assert gone.cpu_pct is None and gone.rss is None
    watched.clear()
    assert src.poll()["processes"] == ()


def test_numa_node_count_reads_sysfs_layout(tmp_path: Path) -> None:
    for name in ("node0", "node1", "possible", "has_cpu"):
        (tmp_path / name).mkdir()
    assert numa_node_count(tmp_path) == 2
    assert numa_node_count(tmp_path / "missing") is None
