"""A server's log is its instance's own: two gpudash instances running a server of the same name into one
log directory write two files (and `<name>.log` links the newest), and after a relaunch the log tail (what
the dashboard's log panel shows) holds the new process's lines, not the old one's. A launch prunes the
server's old logs, and only those. Real processes: the
vLLM double behind a `vllm` that says which run it is."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from gpudash.config import ServerSpec
from gpudash.launcher.server_logs import KEEP_PER_SERVER
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox
from hostile_helpers import DOUBLE


def _counting_vllm(tmp: Path) -> Path:
    """A `vllm` that prints `gpudash-test run N` (N counts its starts), then runs the vLLM double."""
    exe, count = tmp / "vllm", tmp / "runs"
    exe.write_text(f"""#!{sys.executable}
import os, runpy, sys
sys.argv[0] = "vllm"
if not any(a.startswith("--help") for a in sys.argv):
    n = int(open({str(count)!r}).read()) + 1 if os.path.exists({str(count)!r}) else 1
    open({str(count)!r}, "w").write(str(n))
    print(f"gpudash-test run {{n}}", flush=True)
runpy.run_path({str(DOUBLE)!r}, run_name="__main__")
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _spec(tmp: Path) -> ServerSpec:
    return ServerSpec(name="v", kind="vllm", model="m", binary=str(_counting_vllm(tmp)))


def test_two_instances_write_two_logs_and_the_link_names_the_newest(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = Supervisor([_spec(tmp_path)], Inbox(), logs)
    second = Supervisor([_spec(tmp_path)], Inbox(), logs)
    try:
        first.start("v")
        second.start("v")
    finally:
        first.stop_all()
        second.stop_all()
    a, b = first.log_path("v"), second.log_path("v")
    assert a != b and a.parent == b.parent == logs
    for path, run in ((a, "run 1"), (b, "run 2")):
        text = path.read_text()
        assert text.count("=== gpudash") == 1 and f"gpudash-test {run}" in text, text[:500]
    link = logs / "v.log"
    assert link.is_symlink() and link.resolve() == b.resolve()


def test_an_older_single_log_is_kept_when_the_link_takes_its_name(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "v.log").write_text("written by an older gpudash\n")
    sup = Supervisor([_spec(tmp_path)], Inbox(), logs)
    try:
        sup.start("v")
    finally:
        sup.stop_all()
    kept = [p for p in logs.iterdir() if not p.is_symlink() and p.read_text() == "written by an older gpudash\n"]
    assert len(kept) == 1 and (logs / "v.log").is_symlink()


def test_after_a_relaunch_the_tail_holds_the_new_process_lines(tmp_path: Path) -> None:
    sup = Supervisor([_spec(tmp_path)], Inbox(), tmp_path / "logs")
    try:
        sup.start("v")
        assert "gpudash-test run 1" in sup.log_tail("v")
        sup.restart("v")
        tail = sup.log_tail("v")
    finally:
        sup.stop_all()
    assert "gpudash-test run 2" in tail and "gpudash-test run 1" not in tail, tail
    whole = sup.log_path("v").read_text()  # the instance's file keeps both runs, in order
    assert whole.index("gpudash-test run 1") < whole.index("gpudash-test run 2")


def test_a_launch_keeps_the_newest_logs_of_its_server_and_no_file_that_is_not_one(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have this pid
    old = [logs / f"v.20250101-0000{i:02d}-{dead}-1.log" for i in range(KEEP_PER_SERVER + 3)]
    renamed = logs / "v.20240101-000000.log"  # a regular v.log, renamed when the link came: maybe not ours
    live = logs / f"v.20230101-000000-{os.getpid()}-1.log"  # oldest of all, but its instance still runs
    others = [logs / f"vv.20220101-000000-{dead}-1.log", logs / "v.notes.log",
              logs / f"v.20220101-000000-{dead}-1.log.gz", logs / "v.20220101-000000-x-1.log"]
    for age, path in enumerate([*reversed(old), renamed, live, *others]):
        path.write_text(path.name)
        os.utime(path, (1e9 - age * 60, 1e9 - age * 60))  # old[-1] newest, then back in time
    link_like = logs / "v.20210101-000000-1-1.log"
    link_like.symlink_to(old[0].name)  # a link is never one of our logs
    sup = Supervisor([_spec(tmp_path)], Inbox(), logs)
    try:
        sup.start("v")
    finally:
        sup.stop_all()
    kept = sorted(p for p in logs.iterdir() if p.name.startswith("v.2025"))
    assert kept == sorted(old[-(KEEP_PER_SERVER - 1):])  # this launch's own log is the tenth
    assert sup.log_path("v").exists() and live.exists() and renamed.read_text() == renamed.name
    assert all(p.read_text() == p.name for p in others) and link_like.is_symlink()
