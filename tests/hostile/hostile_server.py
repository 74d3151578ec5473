"""A real OpenAI-compatible HTTP server that misbehaves on purpose, one mode at a time.

It runs in a thread of the test process (a ThreadingHTTPServer on 127.0.0.1). `mode` picks what
/v1/chat/completions answers and `models_mode` what /v1/models answers; both can change while it runs.
Huge bodies are generated as they are sent (the server never holds them), so a client that stops
reading costs the test nothing.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GB = 1 << 30
OK_CHUNKS = [
    {"choices": [{"delta": {"role": "assistant"}}]},
    {"choices": [{"delta": {"content": "hi"}}]},
    {"choices": [{"delta": {}, "finish_reason": "stop"}],
     "usage": {"prompt_tokens": 7, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 3}},
     "timings": {"prompt_n": 4, "cache_n": 3, "prompt_ms": 1.5}},
]
# Valid JSON of the wrong shape, one stream chunk each.
WRONG_CHUNKS = {
    "chunk_list": [1, 2, 3],
    "chunk_null": None,
    "choices_strings": {"choices": ["a", "b"]},
    "choices_object": {"choices": {"delta": {"content": "x"}}},
    "delta_string": {"choices": [{"delta": "x"}]},
    "usage_string": {"choices": [{"delta": {"content": "x"}}], "usage": "lots"},
    "usage_negative": {"choices": [{"delta": {"content": "x"}}], "usage": {"prompt_tokens": -5}},
    "timings_string": {"choices": [{"delta": {"content": "x"}}], "timings": "fast"},
    "timings_nan_text": {"choices": [{"delta": {"content": "x"}}], "timings": {"prompt_ms": "NaN"}},
    "timings_cache_list": {"choices": [{"delta": {"content": "x"}}], "timings": {"cache_n": [1]}},
    "timings_huge_int": {"choices": [{"delta": {"content": "x"}}], "timings": {"prompt_n": 10**30}},
}
WRONG_MODELS = {
    "models_list": [{"id": "m"}],
    "models_null": None,
    "models_no_id": {"data": [{"name": "m"}]},
    "models_data_string": {"data": "m"},
    "models_id_object": {"data": [{"id": {"x": 1}}]},
}
CHAT_MODES = ("ok", "never_ending", "drip", "huge_line", "huge_500", "silent", "silent_after_headers",
              "empty_200", "no_done", "bad_json", "nested", "echo_key", "escapes", *WRONG_CHUNKS)
# An error body a terminal would obey: a title set, a screen clear, a colour, and Rich markup for a hyperlink.
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x9b0m [link=file:///etc/shadow]click[/link] [bold]x"
# One family of vLLM's /metrics, as vllm/v1/metrics/loggers.py (vLLM 0.8.5 and 0.33.0) names and labels it:
# enough for gpudash to tell an attached server's kind and read it as ready (`metrics = True`).
VLLM_METRICS = (b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                b"# TYPE vllm:num_requests_running gauge\n"
                b'vllm:num_requests_running{engine="0",model_name="hostile-model"} 0.0\n')
MODELS_MODES = ("ok", "huge", "nested", "silent", "status_500", *WRONG_MODELS)


class HostileServer:
    """Start with `start()`, stop with `close()`; `url` is its base URL."""

    def __init__(self, mode: str = "ok", models_mode: str = "ok", metrics: bool = False):
        self.mode = mode
        self.models_mode = models_mode
        self.metrics = metrics  # GET /metrics answers vLLM's families (else 404, as for any other path)
        self.closing = threading.Event()
        self.chat_started = threading.Event()  # a chat request arrived (for tests that act mid-request)
        self.chat_requests = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="hostile-server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> HostileServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def _sse(chunks: list) -> Iterator[bytes]:
    for c in chunks:
        yield b"data: " + json.dumps(c).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _endless(block: bytes, total: int) -> Iterator[bytes]:
    """`total` bytes of `block` repeated, generated while sent."""
    sent = 0
    while sent < total:
        yield block
        sent += len(block)


def _handler(server: HostileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # the test output stays readable
            pass

        def _head(self, status: int = 200, ctype: str = "text/event-stream", length: int | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            if length is None:
                self.send_header("Connection", "close")  # the body ends when the connection does
            else:
                self.send_header("Content-Length", str(length))
            self.end_headers()

        def _send(self, parts) -> None:
            try:
                for p in parts:
                    if server.closing.is_set():
                        return
                    self.wfile.write(p)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up: that is what it should do
            self.close_connection = True

        def do_GET(self) -> None:
            if self.path == "/metrics" and server.metrics:
                self._head(200, "text/plain; version=0.0.4")  # Connection: close, as it closes after
                self._send([VLLM_METRICS])
                return
            if self.path != "/v1/models":
                self._head(404, "text/plain", 0)
                return
            mode = server.models_mode
            if mode == "silent":
                server.closing.wait()
                return
            if mode == "huge":
                self._head(200, "application/json")
                self._send(itertools.chain([b'{"data": [{"id": "'], _endless(b"m" * 65536, GB)))
                return
            if mode == "nested":
                body = b"[" * 200_000
                self._head(200, "application/json", len(body))
                self._send([body])
                return
            if mode == "status_500":
                self._head(500, "text/plain")
                self._send(_endless(b"e" * 65536, GB))
                return
            value = WRONG_MODELS.get(mode, {"object": "list", "data": [{"id": "hostile-model"}]})
            body = json.dumps(value).encode()
            self._head(200, "application/json", len(body))
            self._send([body])

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(length)
            server.chat_requests += 1
            server.chat_started.set()
            mode = server.mode
            if mode == "silent":
                server.closing.wait()
                return
            if mode == "huge_500":
                self._head(500, "text/plain")
                self._send(_endless(b"x" * 65536, GB))
                return
            if mode == "empty_200":
                self._head(200, "text/event-stream", 0)
                return
            if mode == "escapes":
                body = ESCAPES.encode()
                self._head(500, "text/plain")
                self._send([body])
                return
            if mode == "echo_key":  # an error that quotes the key it was sent, as careless servers do
                body = json.dumps({"error": f"invalid key {self.headers.get('Authorization')!r}"}).encode()
                self._head(401, "application/json")
                self._send([body])
                return
            self._head()
            if mode == "ok":
                self._send(_sse(OK_CHUNKS))
            elif mode == "never_ending":
                self._send(_paced(itertools.repeat(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'), 0.01))
            elif mode == "drip":
                self._send(_paced(itertools.cycle(b'data: {"choices": []}\n\n'[i:i + 1] for i in range(22)), 1.0))
            elif mode == "silent_after_headers":
                self._send([b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'])
                server.closing.wait()
            elif mode == "huge_line":
                self._send(itertools.chain([b"data: "], _endless(b"y" * 65536, GB)))
            elif mode == "no_done":
                self._send([b": just a comment\n\n"])
            elif mode == "bad_json":
                self._send([b"data: {not json\n\n"])
            elif mode == "nested":
                self._send([b"data: " + b"[" * 200_000 + b"\n\n"])
            else:
                self._send(_sse([WRONG_CHUNKS[mode]]))

    return Handler


def _paced(parts: Iterator[bytes], every_s: float) -> Iterator[bytes]:
    for p in parts:
        yield p
        time.sleep(every_s)
