"""A port is a started server's only when the listener on it is that server's process (or one of its
descendants), and whatever gpudash starts ends with everything it spawned. Real processes: the vLLM double
behind `vllm` stand-ins that let a squatter take the port first, that fork a child into a session of its
own and exit, or whose `--help` never ends. The squatter is a listener of this test process: a process
gpudash did not start, as another user's would be."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.health import free_port
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox
from hostile_helpers import DOUBLE, WAIT_S, alive_after_wait, as_user, kill_all, memory_capped


def _exe(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\nimport os, runpy, subprocess, sys, time\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _wait_for(path: Path) -> None:
    end = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


class _Squatter:
    """An HTTP listener that answers 200 to everything and keeps every Authorization header it was sent."""

    def __init__(self, port: int) -> None:
        seen = self.authorization = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                seen.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_POST = do_GET

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _start_with_a_squatter(tmp: Path, squat: Callable[[int], None]) -> Supervisor:
    """Start a server (the vLLM double, its API key set) on a port that `squat(port)` takes once the server
    runs and before it binds: the race another user wins. The start must fail; returns the stopped
    supervisor."""
    port = free_port()
    started, squatted = tmp / "started", tmp / "squatted"
    exe = _exe(tmp / "vllm", f"""sys.argv[0] = "vllm"
if not any(a.startswith("--help") for a in sys.argv):
    open({str(started)!r}, "w").close()
    while not os.path.exists({str(squatted)!r}):
        time.sleep(0.02)
runpy.run_path({str(DOUBLE)!r}, run_name="__main__")
""")
    spec = ServerSpec(name="v", kind="vllm", model="m", binary=str(exe), port=port, health_timeout_s=WAIT_S,
                      env={"VLLM_API_KEY": "sk-must-not-leave"})
    sup = Supervisor([spec], Inbox(), tmp / "logs")

    def race() -> None:
        _wait_for(started)
        squat(port)
        squatted.touch()

    t = threading.Thread(target=race, daemon=True)
    t.start()
    try:
        with pytest.raises(LaunchError, match="exited"):
            sup.start("v")
    finally:
        sup.stop_all()
        t.join(WAIT_S)
    assert sup.states()[0].state.name != "READY"
    return sup


def test_a_port_squatter_is_never_taken_for_the_server(tmp_path: Path) -> None:
    squatter: list[_Squatter] = []
    try:
        _start_with_a_squatter(tmp_path, lambda port: squatter.append(_Squatter(port)))
    finally:
        for s in squatter:
            s.close()
    assert squatter and all(a is None for a in squatter[0].authorization)


def test_a_server_that_forks_and_exits_takes_its_child_along(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    exe = _exe(tmp_path / "vllm", f"""sys.argv[0] = "vllm"
if any(a.startswith("--help") for a in sys.argv):
    runpy.run_path({str(DOUBLE)!r}, run_name="__main__")
    sys.exit(0)
child = subprocess.Popen([sys.executable, {str(DOUBLE)!r}, *sys.argv[1:]], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open({str(pidfile)!r} + ".tmp", "w").write(str(child.pid))
os.replace({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
""")
    spec = ServerSpec(name="v", kind="vllm", model="m", binary=str(exe), health_timeout_s=WAIT_S)
    sup = Supervisor([spec], Inbox(), tmp_path / "logs")
    try:
        with pytest.raises(LaunchError, match="exited with code 0"):
            sup.start("v")
    finally:
        sup.stop_all()
    child = int(pidfile.read_text())
    left = alive_after_wait([child])
    kill_all(left)
    assert left == [], "the forked child outlived the server gpudash gave up on"


HELP_READ = """
import sys
from gpudash.launcher.binary import binary_flags
from gpudash.launcher.kinds import KINDS
try:
    binary_flags(KINDS["llama.cpp"], sys.argv[1])
except RuntimeError as err:
    print("refused:", err)
"""


def test_a_help_that_never_ends_is_cut_and_its_children_end(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    exe = _exe(tmp_path / "llama-server", f"""child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                         start_new_session=True)
open({str(pidfile)!r}, "w").write(str(child.pid))
line = b"y" * 4095 + b"\\n"
while True:
    sys.stdout.buffer.write(line)
""")
    r = subprocess.run([sys.executable, "-c", HELP_READ, str(exe)], capture_output=True, text=True,
                       timeout=WAIT_S * 2, preexec_fn=memory_capped())
    child = int(pidfile.read_text())
    left = alive_after_wait([child])
    kill_all(left)
    assert r.returncode == 0 and "cut short" in r.stdout, r.stdout + r.stderr[-2000:]
    assert left == []


def test_another_users_squatter_gets_no_request_with_the_key(tmp_path: Path, other_user, shared_dir: Path) -> None:
    """The same race with the squatter run by a second account (python3 -m http.server answering 200 on
    /health from a folder of its own), as on a shared box."""
    (shared_dir / "health").write_text("ok")
    squatter: list[subprocess.Popen] = []

    def squat(port: int) -> None:
        squatter.append(as_user(other_user, ["/usr/bin/python3", "-m", "http.server", str(port), "--bind",
                                             "127.0.0.1", "--directory", str(shared_dir)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        end = time.monotonic() + WAIT_S
        while time.monotonic() < end:  # until it listens
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.02)

    try:
        _start_with_a_squatter(tmp_path, squat)
    finally:
        for p in squatter:
            p.terminate()
    log = squatter[0].communicate(timeout=WAIT_S)[1]
    asked = [line for line in log.splitlines() if '"GET ' in line or '"POST ' in line]
    assert asked and all('"GET /health ' in line for line in asked), log  # asked for health, and nothing else
