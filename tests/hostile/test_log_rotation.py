"""A server that prints without end cannot fill the disk: its log rotates at `[logs] server_max_bytes`, one
older part kept. A real process: a `vllm` stand-in that prints 2 MB before it runs the vLLM double."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from gpudash.config import Config, ConfigError, ServerSpec, validate
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox
from hostile_helpers import DOUBLE

LIMIT = 64 << 10
ROTATED = ".1"  # the older part of a rotated log
LINES = 20_000  # of 100 bytes: 2 MB, 30 times the limit


def _chatty(tmp: Path) -> Path:
    exe = tmp / "vllm"
    exe.write_text(f"""#!{sys.executable}
import runpy, sys
sys.argv[0] = "vllm"
if not any(a.startswith("--help") for a in sys.argv):
    for i in range({LINES}):
        print(f"chatter {{i:08d}} " + "x" * 82, flush=False)
    sys.stdout.flush()
runpy.run_path({str(DOUBLE)!r}, run_name="__main__")
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_a_chatty_servers_log_rotates_at_the_configured_size(tmp_path: Path) -> None:
    config = Config.model_validate({"logs": {"server_max_bytes": "64KiB"}})
    logs = tmp_path / "logs"
    sup = Supervisor([ServerSpec(name="v", kind="vllm", model="m", binary=str(_chatty(tmp_path)))], Inbox(), logs,
                     log_max_bytes=config.logs.server_max_bytes)
    try:
        sup.start("v")
    finally:
        sup.stop_all()
    files = [p for p in logs.iterdir() if not p.is_symlink()]
    current = sup.log_path("v")
    assert sorted(p.name for p in files) == sorted([current.name, current.name + ROTATED])
    assert all(p.stat().st_size <= LIMIT + 200 for p in files), {p.name: p.stat().st_size for p in files}
    assert f"chatter {LINES - 1:08d}" in current.read_text() + current.with_name(current.name + ROTATED).read_text()
    assert current.read_text().startswith("=== gpudash ")


def test_the_log_size_setting_is_a_size_and_refuses_a_tiny_one() -> None:
    assert Config.model_validate({"logs": {"server_max_bytes": "1MiB"}}).logs.server_max_bytes == 1 << 20
    with pytest.raises(ConfigError, match="server_max_bytes"):
        validate({"logs": {"server_max_bytes": 100}}, "c.toml")
