"""A server's log is its instance's own: two gpudash instances running a server of the same name into one
log directory write two files (and `<name>.log` links the newest), and after a relaunch the log tail (what
the dashboard's log panel shows) holds the new process's lines, not the old one's. A log is never written
through a link planted at its predictable name, nor into a directory others can write. A launch prunes the
server's old logs, and only those gpudash wrote. Real processes: the vLLM double behind a `vllm` that says
which run it is."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.errors import LaunchError
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
        path.write_text(f"=== gpudash {path.name}")
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
    assert sup.log_path("v").exists() and live.exists() and renamed.read_text() == f"=== gpudash {renamed.name}"
    assert all(p.read_text() == f"=== gpudash {p.name}" for p in others) and link_like.is_symlink()


def _victim(tmp: Path) -> Path:
    """A file that is not gpudash's (root's /etc/shadow in the attack), with its bytes and mode."""
    victim = tmp / "victim"
    victim.write_text("not gpudash's\n")
    victim.chmod(0o600)
    return victim


def test_a_link_planted_at_the_log_name_is_not_followed(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    victim = _victim(tmp_path)
    sup = Supervisor([_spec(tmp_path)], Inbox(), logs)
    planted = sup.log_path("v")  # the name is predictable: <name>.<stamp>-<pid>-<n>.log
    planted.symlink_to(victim)
    try:
        sup.start("v")
        log = sup.log_path("v")
        assert log != planted and "gpudash-test run 1" in log.read_text()
        log.unlink()
        log.symlink_to(victim)  # swapped for a link between two launches of this instance
        sup.restart("v")
    finally:
        sup.stop_all()
    assert victim.read_text() == "not gpudash's\n" and planted.is_symlink()
    log = sup.log_path("v")
    assert not log.is_symlink() and "gpudash-test run 2" in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_log_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    inbox = Inbox()
    sup = Supervisor([_spec(tmp_path)], inbox, logs)
    try:
        with pytest.raises(LaunchError, match=r"can be written by other users \(mode 0777\).*chmod go-w"):
            sup.start("v")
    finally:
        sup.stop_all()
    assert list(logs.iterdir()) == [] and not (tmp_path / "runs").exists()  # nothing written, nothing run
    (event,) = [e for e in inbox.poll()["events"] if e.kind == "server.start"]
    assert not event.ok and "other users" in event.reason


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root (CI runs as root)")
def test_a_log_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    os.chown(logs, 65534, 65534)
    sup = Supervisor([_spec(tmp_path)], Inbox(), logs)
    try:
        with pytest.raises(LaunchError, match="belongs to uid 65534, not to you"):
            sup.start("v")
    finally:
        sup.stop_all()


def _log(path: Path, mtime: float, text: str = "=== gpudash 2025-01-01 00:00:00: vllm serve m\n") -> Path:
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def _launch_once(tmp: Path, logs: Path) -> None:
    sup = Supervisor([_spec(tmp)], Inbox(), logs)
    try:
        sup.start("v")
    finally:
        sup.stop_all()


def _real_logs(logs: Path) -> list[Path]:
    """More instance logs of dead gpudash runs than a launch keeps, oldest first, all in the past hour."""
    logs.mkdir(mode=0o700)
    now = time.time()
    return [_log(logs / f"v.20250101-0000{i:02d}-{DEAD}-1.log", now - 3600 + i) for i in range(KEEP_PER_SERVER + 2)]


def test_pruning_keeps_the_newest_real_logs_when_future_dated_ones_exist(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    real = _real_logs(logs)
    future = [_log(logs / f"v.20990101-0000{i:02d}-1-1.log", time.time() + 365 * 86400) for i in range(KEEP_PER_SERVER)]
    _launch_once(tmp_path, logs)
    assert [p for p in real if p.exists()] == real[-(KEEP_PER_SERVER - 1):]  # the tenth is this launch's own
    assert all(p.exists() for p in future)  # dated in the future: not written by gpudash, so not deleted


DEAD = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have this pid
LOOKALIKES = {  # a name or file that only looks like an instance log of a dead run, older than every real one
    "arabic_indic_digits": (f"v.٢٠٢٠٠١٠١-٠٠٠٠٠٠-{DEAD}-1.log", "=== gpudash \n"),  # `\d` matched these
    "fullwidth_digits": (f"v.２０２００１０１-００００００-{DEAD}-1.log", "=== gpudash \n"),
    "no_gpudash_header": (f"v.20200101-000000-{DEAD}-1.log", "some other program's notes\n"),
    "absurd_pid": (f"v.20200101-000000-{'9' * 200}-1.log", "=== gpudash \n"),
    "another_users_file": (f"v.20200101-000000-{DEAD}-1.log", "=== gpudash \n"),
}


@pytest.mark.parametrize("case", LOOKALIKES)
def test_pruning_deletes_no_lookalike(tmp_path: Path, case: str) -> None:
    if case == "another_users_file" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root (CI runs as root)")
    logs = tmp_path / "logs"
    real = _real_logs(logs)
    name, text = LOOKALIKES[case]
    lookalike = _log(logs / name, 1e9, text)
    if case == "another_users_file":
        os.chown(lookalike, 65534, 65534)
    _launch_once(tmp_path, logs)
    assert lookalike.exists() and lookalike.read_text() == text
    assert [p for p in real if p.exists()] == real[-(KEEP_PER_SERVER - 1):]


def test_a_directory_by_the_links_name_is_neither_renamed_nor_replaced(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "v.log").mkdir(parents=True, mode=0o700)
    (logs / "v.log" / "inside").write_text("theirs\n")
    _launch_once(tmp_path, logs)
    assert (logs / "v.log").is_dir() and (logs / "v.log" / "inside").read_text() == "theirs\n"
    assert [p.name for p in logs.iterdir() if p.name.startswith("v.") and p.is_dir()] == ["v.log"]
