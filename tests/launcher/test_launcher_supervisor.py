"""The supervisor against real llama-server processes on tiny generated models.

Sequential health-gated start, crash detection and restart, graceful stop without orphans, restart with
a new spec, and each bad input ending in one LaunchError that names the server and leaves the others as
they were.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from launcher_helpers import Events, assert_gone

from gpudash.config import ServerSpec
from gpudash.launcher.errors import LaunchError

pytestmark = pytest.mark.llama


def spec(name: str, model: Path, binary: str, **kw) -> ServerSpec:
    return ServerSpec(name=name, model=str(model), binary=binary, ctx_size=512, parallel=1, **kw)


def healthy(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200


def test_sequential_start_is_health_gated(make_supervisor, events: Events, tiny_model, llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server), spec("b", tiny_model, llama_server)])
    sup.start_all()
    seen = [(e.kind, e.target) for e in events.drain()]
    assert seen == [("server.start", "a"), ("server.ready", "a"), ("server.start", "b"), ("server.ready", "b")]
    ready_a = next(e.ts for e in events.seen if e.kind == "server.ready" and e.target == "a")
    start_b = next(e.ts for e in events.seen if e.kind == "server.start" and e.target == "b")
    assert start_b >= ready_a
    ready = next(e for e in events.seen if e.kind == "server.ready" and e.target == "a")
    assert ready.new.startswith("127.0.0.1:") and ready.new.endswith(")")  # address (build info from /props)
    states = {s.server: s for s in sup.states()}
    assert {s.state for s in states.values()} == {"ready"}
    assert states["a"].port != states["b"].port
    for name in ("a", "b"):
        assert healthy(sup.base_url(name))
    assert set(sup.pids().values()) == {"a", "b"}
    assert any("listening on" in line for line in sup.log_tail("a"))
    assert sup.log_path("a").read_text().count("--metrics") == 1


def test_a_requests_decode_speed_in_the_log_is_no_throughput(make_supervisor, tiny_model, llama_server) -> None:
    """llama-server logs each finished request's `eval time = ... tokens per second`: one request's decode
    speed. The supervisor's sample (what a tick holds when /metrics cannot be read, or before two reads give
    a rate) must not offer it as the server's tokens per second."""
    sup = make_supervisor([spec("a", tiny_model, llama_server)])
    sup.start_all()
    reply = httpx.post(f"{sup.base_url('a')}/completion", json={"prompt": "hello", "n_predict": 8},
                       timeout=60, trust_env=False)
    assert reply.status_code == 200
    deadline = time.monotonic() + 30
    while not any("tokens per second" in line for line in sup.log_tail("a")):
        assert time.monotonic() < deadline, "llama-server logged no timings"
        time.sleep(0.1)
    (state,) = sup.states()
    assert state.state == "ready" and state.tokens_per_s is None


def test_crash_is_detected_and_restarted(make_supervisor, events: Events, tiny_model, llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server)], backoff_s=(0.2, 0.4))
    sup.start_all()
    (pid,) = sup.pids()
    port = sup.states()[0].port
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    crash = events.wait_for(lambda e: e.kind == "server.crash")
    assert crash.ts - killed < 1.0
    assert crash.target == "a" and not crash.ok and "-9" in crash.reason
    events.wait_for(lambda e: e.kind == "server.ready" and e.ts > crash.ts)
    (st,) = sup.states()
    assert st.state == "ready" and st.restarts == 1 and st.pid != pid
    assert st.port == port  # same address for clients after a restart
    assert healthy(sup.base_url("a"))


def test_stop_all_leaves_no_process(make_supervisor, events: Events, tiny_model, llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server), spec("b", tiny_model, llama_server)])
    sup.start_all()
    pids = list(sup.pids())
    assert len(pids) == 2
    sup.stop_all()
    assert_gone(pids)
    assert {s.state for s in sup.states()} == {"stopped"}
    assert sup.pids() == {}
    assert events.kinds().count("server.stop") == 2
    assert "server.crash" not in events.kinds()  # an asked-for exit is no crash


def test_stop_kills_the_whole_process_group(make_supervisor, tmp_path, tiny_model) -> None:
    # A "server" that ignores SIGTERM and has a child: stop must SIGKILL both.
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, subprocess, sys, time, http.server, threading\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "http.server.ThreadingHTTPServer(('127.0.0.1', port), H).serve_forever()\n")
    exe = tmp_path / "fake-server"
    exe.write_text(f"#!{sys.executable}\nimport runpy, sys\n"
                   f"if '--help' in sys.argv: print('-m, --model FNAME  m\\n--host H  h\\n--port P  p\\n--metrics  x'); sys.exit(0)\n"
                   f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    exe.chmod(0o755)
    sup = make_supervisor([ServerSpec(name="s", model=str(tiny_model), binary=str(exe))], stop_timeout_s=0.5)
    sup.start_all()
    deadline = time.monotonic() + 10
    while len(sup.pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = list(sup.pids())
    assert len(pids) == 2  # leader and its child
    sup.stop("s")
    assert_gone(pids)


def test_restart_with_new_spec(make_supervisor, events: Events, tiny_model, llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server)])
    sup.start_all()
    (old_pid,) = sup.pids()
    new = sup.specs()["a"].model_copy(update={"ctx_size": 1024})
    sup.restart("a", new)
    (new_pid,) = sup.pids()
    assert new_pid != old_pid and not psutil.pid_exists(old_pid)
    assert sup.specs()["a"].ctx_size == 1024
    props = httpx.get(f"{sup.base_url('a')}/props", timeout=5, trust_env=False).json()
    assert props["default_generation_settings"]["n_ctx"] == 1024
    restart = [e for e in events.drain() if e.kind == "server.restart"][-1]
    assert restart.old["ctx_size"] == 512 and restart.new["ctx_size"] == 1024
    assert (sup.states()[0].relaunches, sup.states()[0].restarts) == (1, 0)  # asked for, not a crash


def test_bad_new_spec_leaves_the_running_server(make_supervisor, tiny_model, llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server)])
    sup.start_all()
    (pid,) = sup.pids()
    bad = sup.specs()["a"].model_copy(update={"model": "/nonexistent/model.gguf"})
    with pytest.raises(LaunchError, match="model file '/nonexistent/model.gguf' does not exist"):
        sup.restart("a", bad)
    assert list(sup.pids()) == [pid]
    assert healthy(sup.base_url("a"))


def test_new_spec_that_dies_falls_back_to_the_old_one(make_supervisor, tiny_model, llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server)])
    sup.start_all()
    # a flag the binary has, with a value it rejects once running (unknown flags are refused before)
    bad = sup.specs()["a"].model_copy(update={"extra_args": ["--cache-type-k", "bogus"]})
    with pytest.raises(LaunchError, match="while loading.*previous settings"):
        sup.restart("a", bad)
    assert sup.specs()["a"].extra_args == []
    assert sup.states()[0].state == "ready" and healthy(sup.base_url("a"))


def test_unknown_extra_flag_is_refused_before_the_old_server_is_touched(make_supervisor, tiny_model,
                                                                        llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server)])
    sup.start_all()
    pid = sup.states()[0].pid
    bad = sup.specs()["a"].model_copy(update={"extra_args": ["--no-such-flag-gpudash"]})
    with pytest.raises(LaunchError, match="has no --no-such-flag-gpudash flag, which `extra_args` needs"):
        sup.restart("a", bad)
    assert sup.states()[0].pid == pid and sup.states()[0].restarts == 0


# ---- bad input: one clear error naming the server and the cause; other servers untouched -----------

@pytest.fixture
def running_a(make_supervisor, tiny_model, llama_server):
    def make(bad: ServerSpec):
        sup = make_supervisor([spec("a", tiny_model, llama_server), bad])
        sup.start("a")
        return sup, list(sup.pids())
    return make


def _assert_a_untouched(sup, pids) -> None:
    assert list(sup.pids()) == pids
    assert healthy(sup.base_url("a"))


def test_missing_model(running_a, llama_server) -> None:
    sup, pids = running_a(ServerSpec(name="b", model="/no/such.gguf", binary=llama_server))
    with pytest.raises(LaunchError) as err:
        sup.start_all()
    assert str(err.value).startswith("server 'b': model file '/no/such.gguf' does not exist")
    _assert_a_untouched(sup, pids)


def test_missing_binary(running_a, tiny_model) -> None:
    sup, pids = running_a(ServerSpec(name="b", model=str(tiny_model), binary="/no/llama-server"))
    with pytest.raises(LaunchError, match=r"server 'b': binary '/no/llama-server' is not an executable"):
        sup.start_all()
    _assert_a_untouched(sup, pids)


def test_port_in_use(running_a, tiny_model, llama_server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        sup, pids = running_a(ServerSpec(name="b", model=str(tiny_model), binary=llama_server, port=port))
        with pytest.raises(LaunchError, match=rf"server 'b': port {port} on 127.0.0.1 is already in use"):
            sup.start_all()
    _assert_a_untouched(sup, pids)
    assert sup.states()[1].state == "stopped"


def test_flag_the_binary_lacks(running_a, tiny_model, tmp_path) -> None:
    old = tmp_path / "old-llama-server"
    old.write_text(f"#!{sys.executable}\nprint('-m, --model FNAME  model\\n--host HOST  h\\n--port PORT  p\\n"
                   f"--metrics  prometheus')\n")
    old.chmod(0o755)
    sup, pids = running_a(ServerSpec(name="b", model=str(tiny_model), binary=str(old), split_mode="tensor"))
    with pytest.raises(LaunchError, match=r"server 'b': .* has no -sm / --split-mode flag, which `split_mode` needs"):
        sup.start_all()
    _assert_a_untouched(sup, pids)


def test_dies_while_loading(running_a, tmp_path, llama_server) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(4096))
    sup, pids = running_a(ServerSpec(name="b", model=str(corrupt), binary=llama_server))
    with pytest.raises(LaunchError) as err:
        sup.start_all()
    msg = str(err.value)
    assert msg.startswith("server 'b': exited with code") and "while loading" in msg
    assert f"(full log: {sup.log_path('b')})" in msg  # this instance's own log of b
    assert sup.states()[1].state == "crashed"
    _assert_a_untouched(sup, pids)


def test_health_timeout(make_supervisor, tmp_path, tiny_model) -> None:
    # A process that never opens its port: the launch gives up after health_timeout_s and kills it.
    exe = tmp_path / "silent"
    exe.write_text(f"#!{sys.executable}\nimport sys, time\n"
                   "if '--help' in sys.argv: print('-m  m\\n--host  h\\n--port  p\\n--metrics  x'); sys.exit(0)\n"
                   "time.sleep(600)\n")
    exe.chmod(0o755)
    sup = make_supervisor([ServerSpec(name="s", model=str(tiny_model), binary=str(exe), health_timeout_s=0.5)])
    with pytest.raises(LaunchError, match=r"server 's': did not answer 200 on /health within 0.5 s"):
        sup.start_all()
    assert sup.pids() == {}


def test_unknown_server_name(make_supervisor, tiny_model, llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server)])
    with pytest.raises(LaunchError, match="server 'zz': no such server; configured: a"):
        sup.stop("zz")


def test_restart_of_a_stopped_server_with_a_failing_spec_stays_stopped(make_supervisor, tiny_model,
                                                                       llama_server) -> None:
    sup = make_supervisor([spec("a", tiny_model, llama_server)])
    bad = sup.specs()["a"].model_copy(update={"extra_args": ["--cache-type-k", "bogus"]})
    with pytest.raises(LaunchError, match="while loading") as err:
        sup.restart("a", bad)
    assert "previous settings" not in str(err.value)
    assert sup.pids() == {} and sup.states()[0].state == "crashed"


def test_crash_loop_backs_off(make_supervisor, events: Events, tmp_path, tiny_model) -> None:
    # Healthy for 0.3 s, then exit 3: every restart crashes again; the waits follow backoff_s.
    exe = tmp_path / "flaky"
    exe.write_text(f"#!{sys.executable}\nimport http.server, sys, threading, os, time\n"
                   "if '--help' in sys.argv: print('-m  m\\n--host  h\\n--port  p\\n--metrics  x'); sys.exit(0)\n"
                   "class H(http.server.BaseHTTPRequestHandler):\n"
                   "    def do_GET(self): self.send_response(200); self.end_headers()\n"
                   "    def log_message(self, *a): pass\n"
                   "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
                   "threading.Timer(0.3, lambda: os._exit(3)).start()\n"
                   "http.server.ThreadingHTTPServer(('127.0.0.1', port), H).serve_forever()\n")
    exe.chmod(0o755)
    sup = make_supervisor([ServerSpec(name="f", model=str(tiny_model), binary=str(exe))], backoff_s=(0.2, 1.0))
    sup.start_all()
    deadline = time.monotonic() + 20
    while events.kinds().count("server.crash") < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = [e for e in events.seen if e.kind in ("server.crash", "server.restart")]
    crashes = [e for e in seen if e.kind == "server.crash"]
    assert len(crashes) >= 3 and all("code 3" in e.reason for e in crashes)
    waits = [nxt.ts - e.ts for e, nxt in zip(seen, seen[1:]) if e.kind == "server.crash" and nxt.kind == "server.restart"]
    assert waits[0] == pytest.approx(0.2, abs=0.15) and waits[1] == pytest.approx(1.0, abs=0.3)
    assert sup.states()[0].restarts >= 2


OWNER = """
import sys, threading
from pathlib import Path
from gpudash.config import ServerSpec
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox
sup = Supervisor([ServerSpec(name="o", model=sys.argv[1], binary=sys.argv[2], ctx_size=256)], Inbox(), Path(sys.argv[3]))
t = threading.Thread(target=sup.start_all)  # a short-lived thread starts it: the server must outlive it
t.start(); t.join()
print(list(sup.pids())[0], flush=True)
threading.Event().wait()
"""


def test_servers_die_with_a_killed_owner(tmp_path, tiny_model, llama_server) -> None:
    import subprocess

    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tiny_model), llama_server, str(tmp_path / "logs")],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        pid = int(owner.stdout.readline())
        time.sleep(0.3)
        assert psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert psutil.Process(pid).name().startswith("llama-server")
        owner.kill()  # no cleanup runs in the owner
        owner.wait()
    finally:
        if owner.poll() is None:
            owner.kill()
    assert_gone([pid])
