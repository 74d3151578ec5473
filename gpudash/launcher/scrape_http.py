"""GET a server's /metrics and /slots each tick, cheaply: one kept-alive http.client connection per server.

httpx spends four times the CPU of the standard library's http.client on a request (dev VM against the
demo llama-server: 0.64 vs 0.17 ms for a tick's two requests, median of 300), and at a 1 s refresh the
scrape was the largest cost of watching after the screen itself (0.3% of a core on the H200 box).

One deadline covers a request from connect to its last byte: every socket read (the status line and the
headers included, which http.client reads line by line) waits at most what is left of it, so a server that
drips its headers one byte at a time cannot hold the read past `deadline_s`; a body is capped, so one that
floods cannot either. `close()` shuts the sockets of reads in flight, so a stop never waits on a read.
A kept-alive connection the server closed while idle (llama-server's cpp-httplib closes one after 5 s, some
servers after every answer without saying `Connection: close`) is retried once on a fresh connection.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

MAX_BODY_BYTES = 8 << 20  # a llama-server's /slots with many slots is tens of KB; vLLM's /metrics ~100 KB
READ_BYTES = 64 << 10
# What a kept-alive connection the server closed while it sat idle raises when it is used again.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class ScrapeError(Exception):
    """One request failed; the message says why in one line."""


class _Late(ScrapeError):
    """The request's deadline passed (or the scraper was closed) before its last byte came."""


class _DeadlineSocket:
    """A connected socket whose every read waits at most until the request's deadline (http.client reads
    the status line and headers through `makefile`, and sends through `sendall`)."""

    def __init__(self, sock: socket.socket, read_timeout_s: float):
        self.sock = sock
        self.read_timeout_s = read_timeout_s
        self.deadline = 0.0
        self._readers = 0  # files made by makefile and not closed: the socket closes after the last one
        self._closing = False

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Late("no whole answer within the deadline")
        return left

    def recv_into(self, buf: Any, n: int = 0) -> int:
        self.sock.settimeout(min(self.read_timeout_s, self.left()))
        return self.sock.recv_into(buf, n)

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(min(self.read_timeout_s, self.left()))
        self.sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: Any, **kw: Any) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closing and self._readers <= 0:
            self.sock.close()

    def close(self) -> None:
        """As socket.close: a response still reading (http.client hands it the socket) keeps it open."""
        self._closing = True
        if self._readers <= 0:
            self.sock.close()

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return self._sock.recv_into(b)

    def close(self) -> None:
        if not self.closed:
            self._sock.reader_closed()
        super().close()


class _Connection(http.client.HTTPConnection):
    """http.client's connection over a _DeadlineSocket: the connect waits at most what is left."""

    def __init__(self, host: str, port: int, read_timeout_s: float):
        super().__init__(host, port, timeout=read_timeout_s)
        self.read_timeout_s = read_timeout_s
        self.deadline = 0.0

    def connect(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Late("no whole answer within the deadline")
        raw = socket.create_connection((self.host, self.port), min(self.timeout, left))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = _DeadlineSocket(raw, self.read_timeout_s)  # type: ignore[assignment]
        self.sock.deadline = self.deadline


class _TlsConnection(_Connection):
    def connect(self) -> None:
        import ssl

        super().connect()
        raw = self.sock.sock  # type: ignore[union-attr]
        raw.settimeout(min(self.timeout, max(0.001, self.deadline - time.monotonic())))
        tls = ssl.create_default_context().wrap_socket(raw, server_hostname=self.host)
        self.sock = _DeadlineSocket(tls, self.read_timeout_s)  # type: ignore[assignment]
        self.sock.deadline = self.deadline


class Scraper:
    """Thread-safe: a connection serves one request at a time (another thread opens its own)."""

    def __init__(self, timeout_s: float, deadline_s: float) -> None:
        self._timeout_s = timeout_s
        self._deadline_s = deadline_s
        self._idle: dict[tuple[str, str, int], _Connection] = {}
        self._busy: set[_Connection] = set()
        self._closed = False
        self._lock = threading.Lock()

    def get(self, base_url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(HTTP status, body) of GET base_url + path (http or https); ScrapeError when no whole answer came
        within the deadline."""
        url = urlsplit(base_url)
        if url.hostname is None:
            raise ScrapeError(f"{base_url} names no host")
        tls = url.scheme == "https"
        key = (url.scheme, url.hostname, url.port or (443 if tls else 80))
        deadline = time.monotonic() + self._deadline_s
        with self._lock:
            conn = self._idle.pop(key, None)
        reused = conn is not None
        while True:
            if conn is None:
                conn = (_TlsConnection if tls else _Connection)(key[1], key[2], self._timeout_s)
            try:
                answer = self._exchange(conn, path, headers or {}, deadline)
                break
            except (OSError, http.client.HTTPException, ScrapeError) as err:
                conn.close()
                if reused and isinstance(err, _STALE) and not self._closed:
                    conn, reused = None, False  # closed while idle: once more, on a new connection
                    continue
                if isinstance(err, _Late) or (isinstance(err, TimeoutError) and time.monotonic() >= deadline):
                    raise ScrapeError(f"GET {path}: no whole answer within {self._deadline_s:g} s") from None
                if self._closed:
                    raise ScrapeError(f"GET {path}: the scraper was closed") from None
                if isinstance(err, ScrapeError):
                    raise
                raise ScrapeError(f"GET {path}: {err or type(err).__name__}") from err
        with self._lock:
            spare = self._idle.setdefault(key, conn) if not self._closed else None
        if spare is not conn:
            conn.close()
        return answer

    def _exchange(self, conn: _Connection, path: str, headers: dict[str, str], deadline: float
                  ) -> tuple[int, bytes]:
        conn.deadline = deadline
        if isinstance(conn.sock, _DeadlineSocket):
            conn.sock.deadline = deadline
        with self._lock:
            if self._closed:
                raise _Late("closed")
            self._busy.add(conn)
        try:
            conn.putrequest("GET", path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()  # connects (within the deadline) when it has no socket yet
            response = conn.getresponse()
            body = bytearray()
            while chunk := response.read1(READ_BYTES):
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise ScrapeError(f"GET {path}: the answer is over {MAX_BODY_BYTES >> 20} MiB")
            response.close()  # the whole body is in: the connection may carry the next request
            return response.status, bytes(body)
        finally:
            with self._lock:
                self._busy.discard(conn)

    def close(self) -> None:
        """Close every connection; a read in flight ends now (its socket is shut) with a ScrapeError."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle.values()), {}
            busy = list(self._busy)
        for conn in busy:
            if isinstance(conn.sock, _DeadlineSocket):
                conn.sock.shutdown()
        for conn in idle:
            conn.close()
