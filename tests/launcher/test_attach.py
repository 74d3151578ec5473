"""Attached servers (`url`): a real llama-server and the vLLM double, each started by the test outside
gpudash, are read (kind told from their /metrics), never signalled, never probed unless asked, and every
action that would relaunch them is refused in one sentence quoting the command line they run with."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest

from gpudash.config import ConfigError, ServerSpec, validate
from gpudash.runtime.control import Controller, ServerAction, SetShare, SetSplit
from gpudash.records import ServerState

NOT_A_SERVER, UNREACHABLE = ServerState.NOT_A_SERVER, ServerState.UNREACHABLE
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.health import free_port
from gpudash.telemetry.servers import SCRAPE_DEADLINE_S, ServerSource
from gpudash.launcher.supervisor import Supervisor
from gpudash.records import ServerSample
from launcher_helpers import started_outside

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "vllm_double.py"


@pytest.fixture
def llama_outside(llama_server: str, tiny_model: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [llama_server, "-m", str(tiny_model), "--host", "127.0.0.1", "--port", str(port), "--metrics",
            "-c", "512", "-np", "1", "-ts", "1"]
    for proc in started_outside(argv, url):
        yield proc, url


@pytest.fixture
def vllm_outside() -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, str(DOUBLE), "serve", "org/model", "--host", "127.0.0.1", "--port", str(port),
            "--load-delay", "0", "--enable-prompt-tokens-details"]
    for proc in started_outside(argv, url):
        yield proc, url


def read_until(source: ServerSource, name: str, cond, timeout_s: float = 20.0) -> ServerSample:
    """Poll like the sampler does until the server's sample meets `cond`."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = next((s for s in source.poll()["servers"] if s.server == name), None)  # a found row comes later
        if st is not None and cond(st):
            return st
        assert time.monotonic() < deadline, f"{name} never got there; last: {st}"
        time.sleep(0.1)


@pytest.mark.llama
def test_attached_llama_server_is_read_and_never_touched(llama_outside, events, tmp_path) -> None:
    proc, url = llama_outside
    sup = Supervisor([ServerSpec(name="ext", url=url)], events.inbox, tmp_path / "logs")
    source = ServerSource(sup)
    try:
        first = read_until(source, "ext", lambda s: s.state == "ready")
        assert (first.kind, first.origin, first.pid, first.error) == ("llama.cpp", "attached", proc.pid, None)
        assert sup.specs()["ext"].kind == "llama.cpp" and sup.pids()[proc.pid] == "ext"
        assert not sup.probed("ext")  # someone's production server: no probe traffic unless probe = true
        r = httpx.post(f"{url}/completion", json={"prompt": "one two three four five", "n_predict": 24},
                       timeout=60, trust_env=False)
        assert r.status_code == 200
        seen = []  # the read after the request has its prompt and generated tokens (a slow read may split them)
        st = read_until(source, "ext", lambda s: seen.append(s) or (
            any((x.prompt_tokens_per_s or 0) > 0 for x in seen) and any((x.tokens_per_s or 0) > 0 for x in seen)))
        assert st.prefix_cache_queries is not None

        with pytest.raises(LaunchError) as err:
            sup.stop("ext")
        sentence = err.value.cause
        assert sentence.startswith("ext is attached, so gpudash only reads it and never restarts or signals it; "
                                   f"it runs here as pid {proc.pid}: `")
        assert f"--port {url.rsplit(':', 1)[1]} --metrics" in sentence and "\n" not in sentence
        ctl = Controller(supervisor=sup, inbox=events.inbox)
        split = ctl.apply(SetSplit("ext", (1.0,)))
        assert not split.ok and "change -ts in that command line and restart it yourself" in split.reason
        assert f"pid {proc.pid}" in split.reason
        share = ctl.apply(SetShare("ext", 0.5))
        assert not share.ok and "change -ngl / -c in that command line" in share.reason
        stop = ctl.apply(ServerAction("ext", "stop"))
        assert not stop.ok and "stop it where it is run" in stop.reason
        sup.stop_all()
    finally:
        source.close()
    assert proc.poll() is None and httpx.get(f"{url}/health", trust_env=False).status_code == 200


@pytest.mark.llama
def test_killing_gpudash_leaves_an_attached_server_running(llama_outside, tmp_path) -> None:
    """`gpudash serve` with one attached server records its rows (no probe requests: off by default);
    after kill -9 of gpudash the server still serves."""
    import sqlite3

    proc, url = llama_outside
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[sampling]\ninterval_s = 0.2\n[sim]\nload = "off"\n[[servers]]\nname = "ext"\nurl = "{url}"\n')
    db = tmp_path / "g.db"
    gd = subprocess.Popen([sys.executable, "-m", "gpudash", "--config", str(cfg), "serve", "--sim", "h200",
                           "--quiet", "--db", str(db)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          start_new_session=True)
    def ready_rows() -> list:
        try:
            with sqlite3.connect(db) as c:
                return c.execute("SELECT kind, state, origin, tokens_per_s FROM server_samples "
                                 "WHERE server = 'ext' AND state = 'ready'").fetchall()
        except sqlite3.OperationalError:  # not created yet
            return []

    talk = threading.Thread(target=lambda: [httpx.post(f"{url}/completion", timeout=60, trust_env=False,
                                                       json={"prompt": f"hello {i}", "n_predict": 64})
                                            for i in range(6)])
    try:
        deadline = time.monotonic() + 60
        rows: list = []
        while time.monotonic() < deadline:
            rows = ready_rows() if db.exists() else []
            if len(rows) >= 2 and not talk.is_alive() and talk.ident is None:
                talk.start()  # once gpudash reads it: the generation falls between two reads
            if len(rows) >= 5 and any((r[3] or 0) > 0 for r in rows):
                break
            assert gd.poll() is None, gd.stderr.read().decode() if gd.stderr else ""
            time.sleep(0.2)
        talk.join()
        assert len(rows) >= 5 and {r[:3] for r in rows} == {("llama.cpp", "ready", "attached")}
        assert any((r[3] or 0) > 0 for r in rows)
        with sqlite3.connect(db) as c:
            assert c.execute("SELECT count(*) FROM requests WHERE server = 'ext'").fetchone() == (0,)
    finally:
        os.kill(gd.pid, signal.SIGKILL)
        gd.wait()
    time.sleep(0.5)
    assert proc.poll() is None and psutil.pid_exists(proc.pid)
    assert httpx.get(f"{url}/health", trust_env=False).status_code == 200


def test_attached_vllm_double_kind_and_ttft_without_the_probe(vllm_outside, events, tmp_path) -> None:
    proc, url = vllm_outside
    sup = Supervisor([ServerSpec(name="v", url=url)], events.inbox, tmp_path / "logs")
    source = ServerSource(sup)
    try:
        read_until(source, "v", lambda s: s.state == "ready")
        for i in range(3):
            r = httpx.post(f"{url}/v1/completions", json={"model": "org/model", "prompt": f"w{i} " * 40,
                                                          "max_tokens": 4}, timeout=30, trust_env=False)
            assert r.status_code == 200
        st = read_until(source, "v", lambda s: s.ttft_mean_s is not None)
        assert (st.kind, st.origin) == ("vllm", "attached") and st.ttft_mean_s > 0  # the server's own histogram
    finally:
        source.close()
    assert proc.poll() is None


class _Answer(BaseHTTPRequestHandler):
    body = b"<html>hello</html>"
    ctype = "text/html"
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", self.ctype)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


class _Metrics(_Answer):
    body = b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
    ctype = "text/plain"


@pytest.fixture
def other_programs() -> Iterator[dict[str, str]]:
    """An HTML page, another program's /metrics, a port nothing listens on, and one that never answers."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (_Answer, _Metrics)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        yield {"html": f"http://127.0.0.1:{servers[0].server_address[1]}",
               "metrics": f"http://127.0.0.1:{servers[1].server_address[1]}",
               "refused": f"http://127.0.0.1:{free_port()}",
               "silent": f"http://127.0.0.1:{silent.getsockname()[1]}"}
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
        silent.close()


def test_bad_urls_say_what_they_are_back_off_and_hold_nothing(other_programs, events, tmp_path) -> None:
    specs = [ServerSpec(name=n, url=u) for n, u in other_programs.items()]
    sup = Supervisor(specs, events.inbox, tmp_path / "logs", backoff_s=(30.0,))
    source = ServerSource(sup)
    try:
        t0 = time.monotonic()
        first = {s.server: s for s in source.poll()["servers"]}
        # the reads run in the background: the poll returns before the silent server's read could give up,
        # which is still in flight; the others may have answered already (a quick local reply on a busy box)
        assert time.monotonic() - t0 < SCRAPE_DEADLINE_S and first["silent"].state == "attaching"
        assert {s.state for s in first.values()} <= {"attaching", NOT_A_SERVER, UNREACHABLE}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out = source.poll()
            got = {s.server: s for s in out["servers"]}
            if all(s.state != "attaching" for s in got.values()):
                break
            time.sleep(0.1)
        assert {n: s.state for n, s in got.items()} == {"html": NOT_A_SERVER, "metrics": NOT_A_SERVER,
                                                         "refused": UNREACHABLE, "silent": UNREACHABLE}
        for s in got.values():
            assert s.error is not None and "\n" not in s.error and "Traceback" not in s.error
            assert s.error.startswith("unreachable" if s.state is UNREACHABLE else "not a llama-server/vLLM")
        assert "Connection refused" in got["refused"].error or "refused" in got["refused"].error.lower()
        assert any(e.startswith("metrics: not a llama-server/vLLM") for e in out["errors"])
        time.sleep(0.05)
        again = {s.server: s for s in source.poll()["servers"]}
        # each row carries the moment it describes, not the time of the last failed read
        assert all(again[n].ts > got[n].ts and again[n].state == got[n].state for n in got)
    finally:
        source.close()


def test_url_entries_are_checked_when_the_config_loads(monkeypatch) -> None:
    def problems(entry: dict) -> str:
        with pytest.raises(ConfigError) as err:
            validate({"servers": [{"name": "a", **entry}]}, "c.toml")
        return str(err.value)

    assert problems({"url": "http://h:1", "model": "m.gguf"}).startswith(
        "c.toml: servers.0: model cannot go with url: an attached server runs already")
    assert "binary cannot go with url" in problems({"url": "http://h:1", "binary": "/bin/x"})
    assert "n_gpu_layers cannot go with url" in problems({"url": "http://h:1", "kind": "llama.cpp", "n_gpu_layers": 9})
    assert "url 'h:1' is not a server's base address" in problems({"url": "h:1"})
    assert "api_key_env" in problems({"url": "http://h:1", "api_key": "x"}) or "unknown field" in problems(
        {"url": "http://h:1", "api_key": "x"})
    spec = validate({"servers": [{"name": "a", "url": "http://h:1/", "api_key_env": "MY_KEY"}]}).servers[0]
    assert (spec.url, spec.kind, spec.attached, spec.probe) == ("http://h:1", None, True, None)


@pytest.mark.llama
def test_an_api_key_comes_from_the_named_variable_and_never_shows(llama_server, tiny_model, events, tmp_path,
                                                                 monkeypatch) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    key = "sk-attach-test-0123456789"
    argv = [llama_server, "-m", str(tiny_model), "--host", "127.0.0.1", "--port", str(port), "--metrics",
            "-c", "512", "--api-key", key]
    for proc in started_outside(argv, url):
        assert httpx.get(f"{url}/metrics", trust_env=False).status_code == 401  # the key guards /metrics
        monkeypatch.setenv("ATTACH_KEY", key)
        monkeypatch.setenv("WRONG_KEY", "sk-not-the-key-000")
        sup = Supervisor([ServerSpec(name="good", url=url, api_key_env="ATTACH_KEY"),
                          ServerSpec(name="bad", url=url, api_key_env="WRONG_KEY")], events.inbox, tmp_path / "logs")
        source = ServerSource(sup)
        try:
            good = read_until(source, "good", lambda s: s.state == "ready")
            bad = read_until(source, "bad", lambda s: s.state == UNREACHABLE)
        finally:
            source.close()
        assert good.kind == "llama.cpp" and good.error is None
        assert "401" in bad.error and key not in bad.error and "sk-not-the-key-000" not in bad.error
        assert key not in sup.refusal("good", "split")  # its command line is quoted with the key masked
        assert "--api-key ***" in sup.refusal("good", "split")


def test_vllm_host_memory_kv_hits_are_a_hit_source_of_their_own(events, tmp_path) -> None:
    """The double with a 4-block GPU cache and a KV offload: prompt A, then B (which evicts A from the GPU),
    then A again, whose blocks come from host memory: external hits, not GPU prefix-cache hits."""
    from gpudash.tui.widgets.latency import server_text

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, str(DOUBLE), "serve", "org/model", "--host", "127.0.0.1", "--port", str(port),
            "--load-delay", "0", "--kv-offloading-size", "1", "--num-gpu-blocks-override", "4"]
    for proc in started_outside(argv, url):
        sup = Supervisor([ServerSpec(name="v", url=url)], events.inbox, tmp_path / "logs")
        source = ServerSource(sup)
        try:
            read_until(source, "v", lambda s: s.state == "ready")
            for words in ("alpha " * 64, "beta " * 64, "alpha " * 64):
                r = httpx.post(f"{url}/v1/completions", json={"model": "org/model", "prompt": words, "max_tokens": 1},
                               timeout=30, trust_env=False)
                assert r.status_code == 200
            st = read_until(source, "v", lambda s: (s.external_prefix_cache_hits or 0) > 0)
        finally:
            source.close()
        assert (st.external_prefix_cache_queries, st.external_prefix_cache_hits) == (192, 64)
        assert st.prefix_cache_hits == 0  # the GPU cache had evicted A: every hit came from host memory
        assert "host KV cache hits 33% since it started" in server_text([st])
