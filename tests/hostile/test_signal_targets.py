"""`K` (SignalProcess through Controller.apply) as root on a shared box: init, pid 0 and negative pids (kill(-1)
signals every process), the kernel's threads, gpudash itself and the processes it runs under (its shell, its
terminal) are refused in one sentence and nothing is signalled; a pid of an attached server is refused
saying gpudash only reads it; apply never raises. Real processes; where a refusal that regressed would
signal init, the test runner or its shell, the last step (psutil's send_signal) only notes the signal, and
the test fails on that note instead."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.health import free_port
from gpudash.launcher.supervisor import Supervisor
from gpudash.runtime.control import Controller, SignalProcess
from gpudash.telemetry.inbox import Inbox
from hostile_helpers import alive_after_wait


def _refused(controller: Controller, pid: object) -> str:
    result = controller.apply(SignalProcess(pid, "TERM"))  # type: ignore[arg-type]
    assert not result.ok and result.reason and "\n" not in result.reason
    (event,) = controller.inbox.poll()["events"]
    assert event.kind == "process.signal" and not event.ok and event.reason == result.reason
    return result.reason


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Signals that would have been sent, by pid (none may be)."""
    noted: list[int] = []
    monkeypatch.setattr(psutil.Process, "send_signal", lambda self, sig: noted.append(self.pid))
    yield noted
    assert noted == []


@pytest.fixture
def controller(sent: list[int]) -> Controller:
    return Controller(inbox=Inbox())


@pytest.mark.parametrize("pid", [-1, 0, 1, -(2**70), True, "1"])
def test_init_and_pids_that_name_no_process_are_refused(controller: Controller, pid: object) -> None:
    assert "is not a process gpudash signals" in _refused(controller, pid)


def test_a_pid_past_any_process_is_refused(controller: Controller) -> None:
    assert "has exited" in _refused(controller, 2**70)


def test_kernel_threads_are_refused(controller: Controller) -> None:
    kthreads = [p.pid for p in psutil.process_iter(["ppid"]) if p.pid == 2 or p.info["ppid"] == 2][:3]
    assert kthreads, "no kernel thread is visible here"
    for pid in kthreads:
        assert "is a kernel thread" in _refused(controller, pid)


def test_gpudash_and_the_processes_it_runs_under_are_refused(controller: Controller) -> None:
    """As the test process stands in for gpudash: itself, its parent (the shell, pytest's runner) and up."""
    assert "is gpudash itself" in _refused(controller, os.getpid())
    for parent in psutil.Process().parents()[:3]:
        if parent.pid > 1:
            assert "a process gpudash runs under" in _refused(controller, parent.pid)


def test_a_plain_process_of_the_user_is_still_signalled() -> None:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        controller = Controller(inbox=Inbox())
        result = controller.apply(SignalProcess(proc.pid, "TERM", "sleep", psutil.Process(proc.pid).create_time()))
        assert result.ok, result.reason
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def local_llama_server() -> Iterator[tuple[subprocess.Popen, str]]:
    """A process whose command line is a llama-server on a port (discovery matches it to an attached url)."""
    port = free_port()
    proc = subprocess.Popen(["llama-server", "-c", "sleep 600; :", "--port", str(port)], executable="/bin/sh")
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_an_attached_servers_pid_is_refused_as_attached(local_llama_server, tmp_path: Path, sent: list[int]) -> None:
    proc, url = local_llama_server
    inbox = Inbox()
    sup = Supervisor([ServerSpec(name="a", url=url)], inbox, tmp_path / "logs")
    try:
        controller = Controller(supervisor=sup, inbox=inbox)
        for _ in range(200):  # until /proc shows the command line the shell was started with
            if psutil.Process(proc.pid).cmdline()[:1] == ["llama-server"]:
                break
        reason = _refused(controller, proc.pid)
    finally:
        sup.stop_all()
    assert reason.startswith("a is attached, so gpudash only reads it and never restarts or signals it")
    assert f"it runs here as pid {proc.pid}" in reason and "supervises" not in reason
    assert alive_after_wait([proc.pid], 0.2) == [proc.pid]  # nothing was signalled
