"""Servers never outlive gpudash, and a stop never waits for a server that will not become healthy.

Real processes throughout: a server that ignores SIGTERM and has a grandchild doing the same, a parent
killed with SIGKILL, and a vLLM stand-in that crashes once and then never becomes healthy again.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.guard import guarded
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "vllm_double.py"
WAIT_S = 60.0  # generous bound on how long a test waits for what must happen promptly

STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(3600)
"""

# Stands in for gpudash: spawns the guarded server in its own group, says its pid, and waits to be killed.
PARENT = """
import subprocess, sys, time
from gpudash.launcher.guard import guarded
p = subprocess.Popen(guarded([sys.executable, sys.argv[1], sys.argv[2]], grace_s=0.5), start_new_session=True)
print(p.pid, flush=True)
time.sleep(3600)
"""


def _gone(pids: list[int]) -> list[int]:
    """Pids still running after a generous wait (zombies count as gone)."""
    end = time.monotonic() + WAIT_S
    alive = pids
    while alive and time.monotonic() < end:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.05)
    return alive


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _wait_file(path: Path) -> str:
    end = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.02)
    return path.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the keeper uses Linux's PR_SET_PDEATHSIG")
def test_a_stubborn_server_and_its_grandchild_die_with_a_killed_parent(tmp_path: Path) -> None:
    script, pidfile = tmp_path / "stubborn.py", tmp_path / "pids"
    script.write_text(STUBBORN)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(script), str(pidfile)], stdout=subprocess.PIPE,
                              text=True)
    try:
        leader = int(parent.stdout.readline())
        server, grandchild = map(int, _wait_file(pidfile).split())
        group = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == leader]
        assert leader == server and {server, grandchild} < set(group)  # the keeper is the third
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone(group) == []
    finally:
        parent.kill()
        for pid in map(int, pidfile.read_text().split()) if pidfile.exists() else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_server_keeps_its_exit_status(tmp_path: Path) -> None:
    assert subprocess.run(guarded([sys.executable, "-c", "raise SystemExit(7)"])).returncode == 7
    killed = subprocess.run(guarded([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]))
    assert killed.returncode == -signal.SIGKILL


def _crash_once_then_hang(tmp_path: Path) -> Path:
    """A `vllm` that is healthy once, exits a moment later, and on every later start never answers."""
    exe = tmp_path / "vllm"
    state = tmp_path / "started-once"
    exe.write_text(f"""#!{sys.executable}
import os, runpy, sys, threading, time
sys.argv[0] = "vllm"
if any(a.startswith("--help") for a in sys.argv) or not os.path.exists({str(state)!r}):
    if not any(a.startswith("--help") for a in sys.argv):
        open({str(state)!r}, "w").close()
        threading.Timer(1.0, lambda: os._exit(3)).start()
    runpy.run_path({str(DOUBLE)!r}, run_name="__main__")
else:
    time.sleep(3600)
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_stop_wins_over_a_restart_that_never_becomes_healthy(tmp_path: Path) -> None:
    inbox = Inbox()
    spec = ServerSpec(name="v", kind="vllm", model="m", binary=str(_crash_once_then_hang(tmp_path)),
                      health_timeout_s=3600)
    sup = Supervisor([spec], inbox, tmp_path / "logs", backoff_s=(0.05,))
    try:
        sup.start("v")
        end = time.monotonic() + WAIT_S
        seen: list[str] = []
        while time.monotonic() < end and not ("server.crash" in seen and sup.states()[0].state == "loading"):
            seen += [e.kind for e in inbox.poll()["events"]]
            time.sleep(0.02)
        assert sup.states()[0].state == "loading", seen
        pids = list(sup.pids())
        stopper = threading.Thread(target=sup.stop, args=("v",), daemon=True)
        stopper.start()
        stopper.join(WAIT_S)
        assert not stopper.is_alive(), "stop waited for the health timeout"
        assert sup.states()[0].state == "stopped"
        assert _gone(pids) == []
    finally:
        sup.stop_all()


def test_sigterm_on_serve_wins_over_a_restart_that_never_becomes_healthy(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "v"\nkind = "vllm"\nmodel = "m"\nbinary = "{_crash_once_then_hang(tmp_path)}"\n'
                   "health_timeout_s = 3600\n[probe]\nenabled = false\n")
    db = tmp_path / "g.db"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "c"),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_DATA_HOME": str(tmp_path / "data")}
    serve = subprocess.Popen([sys.executable, "-c", "from gpudash.cli import main; main()", "serve", "--config",
                              str(cfg), "--db", str(db), "--sim", "h200", "--quiet"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + WAIT_S
        restarting = False
        while not restarting and time.monotonic() < end and serve.poll() is None:
            time.sleep(0.1)
            restarting = db.exists() and _events(db, "server.restart") > 0
        assert restarting, "the server never crashed and restarted"
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=WAIT_S)
    finally:
        serve.kill()
    assert serve.returncode == 0, err
    assert "Traceback" not in err
    assert _gone([p.pid for p in psutil.process_iter() if str(tmp_path) in " ".join(_cmdline(p))]) == []


def _events(db: Path, kind: str) -> int:
    import sqlite3

    try:
        with sqlite3.connect(db, timeout=5) as c:
            return c.execute("SELECT count(*) FROM events WHERE kind = ?", [kind]).fetchone()[0]
    except sqlite3.Error:
        return 0


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
