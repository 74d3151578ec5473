"""The last two reads and writes that did not go through private_fs: the PCIe calibration cache (written
through whatever sat at its name, read with no cap) and a llama-server's `--version` and build_info.json
(read whole, however much a binary named in a config prints or a file there holds)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from gpudash.telemetry.pcie_cache import Calibration, load_all, save
from hostile_helpers import WAIT_S, memory_capped, plant_fifo

VICTIM = "root's file: must stay as it was\n"


def _cal(uuid: str) -> Calibration:
    return Calibration(uuid=uuid, payload_bytes=10**9, rx_counted=int(1.09e9), tx_counted=int(1.09e9),
                       h2d_gbps=53.0, d2h_gbps=54.0)


def test_the_calibration_cache_is_written_through_no_link_and_read_from_no_fifo(tmp_path: Path) -> None:
    victim = tmp_path / "victim.conf"
    victim.write_text(VICTIM)
    cache = tmp_path / "cache" / "pcie_calibration.json"
    cache.parent.mkdir()
    cache.symlink_to(victim)
    save(_cal("GPU-a"), cache)
    assert victim.read_text() == VICTIM  # the link is replaced, not written through
    assert not cache.is_symlink() and set(load_all(cache)) == {"GPU-a"}
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    cache.unlink()
    plant_fifo(cache)
    started = time.monotonic()
    reader = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                             "from gpudash.telemetry.pcie_cache import load_all; print(load_all(Path(sys.argv[1])))",
                             str(cache)], capture_output=True, text=True, timeout=WAIT_S)
    assert reader.returncode == 0 and reader.stdout.strip() == "{}", reader.stderr
    assert time.monotonic() - started < WAIT_S


def test_a_llama_server_that_prints_its_version_for_ever_is_cut_off_with_its_children(tmp_path: Path) -> None:
    """A program named as llama-server that forks a child and prints without end: `--version` is read
    bounded and both end; its build_info.json, a link to /dev/zero, is not read at all."""
    pids = tmp_path / "pids"
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys
        child = os.fork()
        if child == 0:
            os.setsid()  # leaves the group: only the spawn tag finds it
            open({str(pids)!r}, "a").write(f"{{os.getpid()}}\\n")
            while True:
                os.write(1, b"version: 1 (child)\\n" * 512)
        open({str(pids)!r}, "a").write(f"{{os.getpid()}}\\n")
        while True:
            os.write(1, b"version: 1\\n" * 1024)
        """))
    binary.chmod(0o755)
    (binary.parent / "build_info.json").symlink_to("/dev/zero")
    # in a child whose memory is capped: an unbounded read ends there in MemoryError, not in the box's OOM killer
    reader = subprocess.run([sys.executable, "-c", "import sys; from gpudash.launcher.llama.build_info import "
                             "read_llama_build; print(read_llama_build(sys.argv[1]).version)", str(binary)],
                            capture_output=True, text=True, timeout=WAIT_S, preexec_fn=memory_capped())
    assert reader.returncode == 0, reader.stderr[-2000:]
    version = reader.stdout.strip()
    assert version.startswith("1") and len(version) < 1 << 20  # what was read is bounded, not all printed
    deadline = time.monotonic() + WAIT_S
    started = [int(p) for p in pids.read_text().split()]
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in started):
        assert time.monotonic() < deadline, f"still running: {started}"
        time.sleep(0.1)
    assert len(started) == 2
    assert os.path.islink(binary.parent / "build_info.json")  # left as it was
