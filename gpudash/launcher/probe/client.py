"""Reading a server's answer without trusting it: one deadline per request, capped bytes, instant cancel.

httpx's timeouts apply per network read, so a server that drips one byte a second, or streams events
forever, would hold a request without end. `Cutoff` gives each request a whole-request deadline: once the
response headers are in, a timer shuts the connection's socket down at the deadline (a blocked read then
returns at once), and `cancel()` does the same to every request in flight (Ctrl-C, stop), including one
still waiting for its headers: httpcore's trace hook hands over each connection's socket as it connects
(pass `extensions=cutoff.extensions` to the request). Bodies are read raw (no decompression) and in
capped amounts, so a 1 GB answer costs a few KB of memory, not a GB.

The event-stream reader here is deliberately tiny: general SSE libraries buffer a line of any length.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import httpx

from gpudash.outside import printable

# Caps on what one answer may hold; a real chat stream of a few hundred tokens is a few tens of KB.
MAX_LINE_BYTES = 1 << 20  # one event-stream line
MAX_STREAM_BYTES = 64 << 20  # a whole streamed answer
MAX_BODY_BYTES = 4 << 20  # a non-streamed body (/v1/models)
ERROR_BODY_BYTES = 2048  # how much of an error answer is read, for the message
ERROR_LINE_CHARS = 200  # an error's one line, as stored and shown


class ProbeFailure(ValueError):
    """One request failed for a reason the server caused; the message is one sentence."""


class Cutoff:
    """Ends requests at their deadline, or all of them at once on `cancel()`, by shutting their sockets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[socket.socket, threading.Event] = {}  # socket being read -> its watch's "fired"
        self._cancelled = threading.Event()
        self._connections: weakref.WeakSet[socket.socket] = weakref.WeakSet()  # every socket connected for it

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def extensions(self) -> dict[str, Any]:
        """The httpx request extensions through which this cutoff learns the request's connection."""
        return {"trace": self._trace}

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook (on the request's thread): keep each new connection's socket, so that a
        cancel reaches a request that is still waiting for its headers, before watch() has its socket."""
        if event not in ("connection.connect_tcp.complete", "connection.connect_unix_socket.complete"):
            return
        sock = info["return_value"].get_extra_info("socket")
        if sock is None:
            return
        with self._lock:
            self._connections.add(sock)
        if self.cancelled:
            _shut(sock)

    def cancel(self) -> None:
        """Every request in flight ends now, and every later one fails at once."""
        self._cancelled.set()
        with self._lock:
            live = list(self._live.items())
            connections = list(self._connections)
        for sock, fired in live:
            fired.set()  # before the shutdown: the reader must never take the cut stream for a normal end
            _shut(sock)
        for sock in connections:  # requests waiting for their headers, and idle pooled connections
            _shut(sock)

    def timeout(self, deadline: float) -> httpx.Timeout:
        """httpx timeouts for the part before the headers arrive: no single wait past the deadline."""
        left = deadline - time.monotonic()
        if self.cancelled:
            raise ProbeFailure("the probe was stopped")
        if left <= 0:
            raise ProbeFailure("the request deadline passed before it was sent")
        return httpx.Timeout(left)

    @contextlib.contextmanager
    def watch(self, response: httpx.Response, deadline: float) -> Iterator[threading.Event]:
        """While reading `response`'s body: at `deadline` (or on cancel) its socket is shut down. Yields an
        Event that is set when that happened, since a shut connection can look like a normal end."""
        fired = threading.Event()
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:  # no socket to shut (a test transport): the per-chunk deadline check still holds
            yield fired
            return

        def expire() -> None:
            fired.set()
            _shut(sock)

        timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
        timer.daemon = True
        with self._lock:
            self._live[sock] = fired
        timer.start()
        try:
            if self.cancelled:
                expire()
            yield fired
        finally:
            timer.cancel()
            with self._lock:
                self._live.pop(sock, None)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def read_capped(response: httpx.Response, cap: int, deadline: float) -> bytes:
    """The raw body, failing once it passes `cap` bytes or the deadline."""
    buf = bytearray()
    for part in response.iter_raw():
        buf += part
        if len(buf) > cap:
            raise ProbeFailure(f"the answer is larger than {cap} bytes")
        if time.monotonic() > deadline:
            raise ProbeFailure("the answer did not finish within the request deadline")
    return bytes(buf)


def read_prefix(response: httpx.Response, n: int = ERROR_BODY_BYTES) -> str:
    """The first `n` bytes of the body as text, for an error message; the rest is never read."""
    buf = bytearray()
    for part in response.iter_raw():
        buf += part
        if len(buf) >= n:
            break
    return bytes(buf[:n]).decode("utf-8", errors="replace").strip()


def error_line(status: int, body: str, cap: int = ERROR_LINE_CHARS) -> str:
    """One readable line for an error answer: "HTTP 400: <the server's message>", the message taken from
    the JSON error shapes servers use (OpenAI's and llama-server's {"error": {"message"}}, vLLM's
    ErrorResponse, FastAPI's {"detail"}, a plain {"error": "..."}), else the body's first line; control
    characters shown as escapes, at most `cap` characters."""
    message: Any = None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        message = err.get("message") if isinstance(err, dict) else err
        message = message if isinstance(message, str) and message else data.get("message") or data.get("detail")
    if not isinstance(message, str) or not message.strip():
        message = body.strip().splitlines()[0] if body.strip() else "(no body)"
    line = printable(f"HTTP {status}: {' '.join(message.split())}")
    return line if len(line) <= cap else line[:cap - 1] + "…"


def sse_data(response: httpx.Response, deadline: float) -> Iterator[bytes]:
    """The payloads of an event stream's `data:` lines, up to `[DONE]`, with every size capped."""
    buf = bytearray()
    total = 0
    for part in response.iter_raw():
        total += len(part)
        if total > MAX_STREAM_BYTES:
            raise ProbeFailure(f"the stream passed {MAX_STREAM_BYTES} bytes without ending")
        buf += part
        while (end := buf.find(b"\n")) >= 0:
            line = bytes(buf[:end]).rstrip(b"\r")
            del buf[:end + 1]
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                if data:
                    yield data
        if len(buf) > MAX_LINE_BYTES:
            raise ProbeFailure(f"the stream sent a line longer than {MAX_LINE_BYTES} bytes")
        if time.monotonic() > deadline:
            raise ProbeFailure("the stream did not finish within the request deadline")


def parse_json(data: bytes, what: str) -> Any:
    """JSON from bytes; anything unparsable (bad text, absurd nesting) is a ProbeFailure naming `what`."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ProbeFailure(f"{what} is not valid JSON ({type(err).__name__})") from None
