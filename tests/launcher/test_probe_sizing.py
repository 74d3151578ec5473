"""The probe's prompt is the size `[probe] prompt_tokens` says, counted by the server's own /tokenize, and
fits the slot it lands in (issue 34 item 6, issue 36 item 2): against a real llama-server with 2048-token
slots (`-c 4096 -np 2`), whose demo tokenizer makes several tokens of a word, and the vLLM double. A request
the server refuses is one readable line. The probe runs in a burst, then backs off (issue 36 item 6)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from gpudash.config import ProbeConfig
from gpudash.launcher.health import free_port, wait_healthy
from gpudash.launcher.probe.client import error_line
from gpudash.launcher.probe.runner import ProbeRunner, run_probe
from gpudash.telemetry.inbox import Inbox
from launcher_helpers import OneServer, QuietHandler, started_outside
from test_attach import DOUBLE


@pytest.fixture
def llama_2048_slots(llama_server, tiny_model) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    for _ in started_outside([llama_server, "-m", str(tiny_model), "--host", "127.0.0.1", "--port", str(port),
                              "-c", "4096", "-np", "2", "-t", "1"], url):
        yield url


@pytest.mark.llama
def test_the_default_prompt_has_its_tokens_on_a_many_tokens_a_word_model(llama_2048_slots: str) -> None:
    """256 tokens asked: 256 words were ~2000 tokens on this tokenizer (and HTTP 400 on a 2048-token slot)."""
    words = run_probe(llama_2048_slots, requests=3, prompt_words=256, max_tokens=4)
    assert all(not r.ok for r in words) and "exceeds the available context size" in words[0].error
    got = run_probe(llama_2048_slots, requests=6, prompt_tokens=256, max_tokens=4)
    assert all(r.ok for r in got), [r.error for r in got]
    assert all(r.prompt_tokens == pytest.approx(256, rel=0.10) for r in got), [r.prompt_tokens for r in got]


@pytest.mark.llama
def test_a_prompt_larger_than_the_slot_is_fitted_to_it(llama_2048_slots: str) -> None:
    got = run_probe(llama_2048_slots, requests=3, prompt_tokens=5000, max_tokens=16)
    assert all(r.ok for r in got), [r.error for r in got]
    assert all(1800 <= r.prompt_tokens <= 2048 - 16 for r in got), [r.prompt_tokens for r in got]


@pytest.mark.llama
def test_the_cli_probe_of_the_newcomers_server_succeeds(llama_2048_slots: str, tmp_path) -> None:
    """The repro of issue 36 item 2: `gpudash probe URL` with the defaults against `-c 4096 -np 2`."""
    out = subprocess.run([sys.executable, "-m", "gpudash", "probe", llama_2048_slots, "--requests", "4"],
                         capture_output=True, text=True, timeout=300, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert f"{llama_2048_slots}: 4 requests (0 failed)" in out.stdout, out.stdout  # it was 20 of 20 HTTP 400


@pytest.mark.llama
def test_a_refused_request_is_one_readable_line(llama_2048_slots: str) -> None:
    (r,) = run_probe(llama_2048_slots, requests=1, prompt_words=3000, max_tokens=4)
    assert not r.ok and r.error.startswith("HTTP 400: request (") and "exceeds the available context size" in r.error
    assert "{" not in r.error and "\n" not in r.error and len(r.error) <= 200


def test_the_vllm_double_counts_with_its_tokenize() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, str(DOUBLE), "serve", "m", "--port", str(port), "--load-delay", "0",
                             "--max-model-len", "300"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(proc, f"{url}/health", 60.0)
        got = run_probe(url, requests=3, prompt_tokens=100, max_tokens=4)
        big = run_probe(url, requests=2, prompt_tokens=1000, max_tokens=4)  # max_model_len 300: fitted
    finally:
        proc.kill()
        proc.wait()
    assert all(r.ok and r.prompt_tokens == pytest.approx(100, rel=0.10) for r in got), [r.prompt_tokens for r in got]
    assert all(r.ok and r.prompt_tokens <= 300 for r in big), [(r.prompt_tokens, r.error) for r in big]


@pytest.mark.parametrize("status, body, line", [
    (400, '{"error":{"code":400,"message":"request (2077 tokens) exceeds the available context size (2048 tokens), '
          'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":2077,"n_ctx":2048}}',
     "HTTP 400: request (2077 tokens) exceeds the available context size (2048 tokens), try increasing it"),
    (404, '{"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": "model", '
          '"code": 404}}', "HTTP 404: The model `x` does not exist."),
    (422, '{"detail": "Field required"}', "HTTP 422: Field required"),
    (500, "Internal\nServer Error\x1b[2J", "HTTP 500: Internal"),
    (502, "", "HTTP 502: (no body)"),
])
def test_error_lines(status: int, body: str, line: str) -> None:
    assert error_line(status, body) == line


class _Ok(QuietHandler):
    protocol_version = "HTTP/1.1"
    chats = 0

    def do_GET(self) -> None:
        self.reply(200, b'{"data": [{"id": "m"}]}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/chat/completions":
            self.reply(404, b"{}")
            return
        type(self).chats += 1
        self.reply(200, b'data: {"choices": [{"delta": {"content": "x"}}]}\n\ndata: [DONE]\n\n', "text/event-stream")


def test_the_probe_runs_a_burst_then_backs_off() -> None:
    handler = type("H", (_Ok,), {"chats": 0})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    runner = ProbeRunner(OneServer(f"http://127.0.0.1:{srv.server_address[1]}"),
                         ProbeConfig(interval_s=0.05, burst_rounds=4, backoff_interval_s=30.0, concurrency=2,
                                     prompt_tokens=8, max_tokens=2), Inbox())
    try:
        runner.start()
        time.sleep(2.0)  # forty intervals: the burst's four rounds, then the first of the slow ones waits 30 s
    finally:
        runner.stop()
        srv.shutdown()
        srv.server_close()
    assert handler.chats == 4 * 2
