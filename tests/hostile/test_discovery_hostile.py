"""Discovery against processes any local user can start: a process named `llama-server` whose --port or
--host cannot be a server's address is skipped (it raised ValueError or httpx.InvalidURL out of
find_servers and process_at, crashing `status` and `launch` and keeping local attached servers
"attaching"); and a llama-server on the CPU is found by its command line, on a machine whose GPUs
gpudash does not see (the simulated rig), so `A` attaches it and `W` writes it. Real processes."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpudash.config import Config, ServerSpec, load_config, save_server
from gpudash.launcher.discovery import find_servers, process_at
from gpudash.launcher.health import free_port, wait_healthy
from gpudash.launcher.supervisor import Supervisor
from gpudash.records import ServerState
from gpudash.runtime.control import AttachServer, Controller
from gpudash.telemetry.inbox import Inbox
from gpudash.telemetry.servers import ServerSource
from hostile_helpers import WAIT_S, gpudash
from hostile_server import HostileServer

HOSTILE_ARGS = {  # what follows `llama-server` on a command line someone else started
    "superscript_port": [b"--port", "²".encode()],
    "5000_digit_port": [b"--port", b"9" * 5000],
    "port_zero": [b"--port", b"0"],
    "control_host": [b"--host", b"\x1b]0;owned\x07\x1b[2J"],
    "not_utf8_host": [b"--host", b"\xff\xfe\x80"],
    "host_with_a_path": [b"--host", b"evil.example/x?y#z"],
}


@pytest.fixture
def hostile_processes() -> Iterator[dict[str, int]]:
    """One process per HOSTILE_ARGS case whose command line is `llama-server ARGS` (a shell that sleeps,
    named llama-server; `; :` keeps the shell from exec'ing sleep, which would replace its command line)."""
    procs = {case: subprocess.Popen([b"llama-server", b"-c", b"sleep 600; :", *args], executable="/bin/sh",
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for case, args in HOSTILE_ARGS.items()}
    try:
        yield {case: p.pid for case, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def _wait_listed(pids: dict[str, int]) -> None:
    """Until /proc shows each process's command line (a fresh process still shows /bin/sh's for a moment)."""
    end = time.monotonic() + WAIT_S
    while any(psutil.Process(p).cmdline()[:1] != ["llama-server"] for p in pids.values()) and time.monotonic() < end:
        time.sleep(0.05)


@pytest.mark.parametrize("case", HOSTILE_ARGS)
def test_a_command_line_that_cannot_be_an_address_is_skipped(hostile_processes: dict[str, int], case: str) -> None:
    _wait_listed(hostile_processes)
    pid = hostile_processes[case]
    assert find_servers([(0, pid)], check=False) == []  # on a GPU, as NVML would list it
    assert [f for f in find_servers([], by_cmdline=True, check=False) if f.pid == pid] == []
    assert process_at("http://127.0.0.1:8080") is None or process_at("http://127.0.0.1:8080")[0] != pid


def test_status_and_a_local_attached_server_survive_them(hostile_processes: dict[str, int], tmp_path: Path) -> None:
    _wait_listed(hostile_processes)
    r = gpudash("status", "--sim", "h200", "--json", "--window", "0.05", home=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    found = {f["pid"] for f in json.loads(r.stdout)["found_servers"]}
    assert found.isdisjoint(hostile_processes.values())
    r = gpudash("status", "--sim", "h200", "--window", "0.05", home=tmp_path)
    assert r.returncode == 0 and "\x1b" not in r.stdout, r.stderr
    srv = HostileServer(metrics=True).start()  # a local attached server: its process is looked for here
    sup = Supervisor([ServerSpec(name="a", url=srv.url)], Inbox(), tmp_path / "logs")
    source = ServerSource(sup)
    try:
        end, state = time.monotonic() + WAIT_S, None
        while state is not ServerState.READY and time.monotonic() < end:
            state = next(s.state for s in source.poll()["servers"] if s.server == "a")
            time.sleep(0.1)
    finally:
        source.close()
        sup.stop_all()
        srv.close()
    assert state is ServerState.READY


@pytest.fixture
def llama_on_the_cpu(llama_server: str, tiny_model: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """A real llama-server started outside gpudash, on the CPU (this machine has no GPU)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([llama_server, "-m", str(tiny_model), "--host", "127.0.0.1", "--port", str(port),
                             "--metrics", "-c", "512", "-np", "1"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(proc, f"{url}/health", WAIT_S)
        yield proc, url
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.llama
def test_a_server_on_the_cpu_is_found_by_its_command_line(llama_on_the_cpu, tmp_path: Path) -> None:
    proc, url = llama_on_the_cpu
    r = gpudash("status", "--sim", "h200", "--json", "--window", "0.05", home=tmp_path)
    assert r.returncode == 0, r.stderr
    (mine,) = [f for f in json.loads(r.stdout)["found_servers"] if f["pid"] == proc.pid]
    assert (mine["kind"], mine["url"], mine["gpus"], mine["answers"]) == ("llama.cpp", url, [], True)
    r = gpudash("status", "--sim", "h200", "--window", "0.05", home=tmp_path)
    assert f"{url.removeprefix('http://')}: llama.cpp pid {proc.pid} on no GPU gpudash sees at {url} (answers)" in r.stdout


@pytest.mark.llama
def test_on_a_simulated_rig_a_found_server_can_be_attached_and_written(llama_on_the_cpu, tmp_path: Path) -> None:
    """A run on the simulated rig (as `launch --sim` builds it) shows the server on the CPU as a found row;
    what the Servers view's `A` and `W` do with that row then works: attach it for the run, write its entry."""
    from gpudash.runtime.run import Run

    proc, url = llama_on_the_cpu
    cfg = Config(servers=[ServerSpec(name="a", url="http://127.0.0.1:9")])  # configured: no demo is started
    run = Run(cfg, "sim:h200", tmp_path / "g.db", servers=True)
    try:
        assert run.stack is not None
        end, row = time.monotonic() + WAIT_S, None
        while row is None and time.monotonic() < end:
            row = next((s for s in run.stack.source.poll()["servers"] if s.pid == proc.pid), None)
            time.sleep(0.1)
        assert row is not None and row.origin == "found" and row.url == url
        controller = Controller(supervisor=run.stack.supervisor, inbox=run.inbox)
        result = controller.apply(AttachServer(row.server, row.kind, row.url))
        assert result.ok, result.reason
        assert run.stack.supervisor.specs()[row.server].url == url
        path = tmp_path / "config.toml"
        save_server(path, {"name": row.server, "kind": row.kind, "url": row.url})
        assert load_config(path).servers == [ServerSpec(name=row.server, kind="llama.cpp", url=url)]
    finally:
        run.close()
