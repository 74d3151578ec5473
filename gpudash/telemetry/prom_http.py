"""The exporter's HTTP server: prometheus_client's WSGI app (content negotiation, gzip, `name[]`) behind a
server that treats every client as an untrusted peer, as node_exporter's web config and Go's http.Server do
(ReadHeaderTimeout, IdleTimeout, a bound on what is served at once).

- **Idle deadline**: a read or write on a connection that makes no progress for `idle_timeout_s` ends it (a
  client that connects and says nothing, or stops reading the answer).
- **Header deadline**: the request line and headers must be in `header_timeout_s` after the connection was
  accepted, however slowly they drip (each read waits at most what is left of it).
- **Connection cap**: at most `max_connections` are held, and never more than a quarter of the process's
  descriptor limit (RLIMIT_NOFILE), so the recorder's store, /proc reads and server scrapes always have
  descriptors left. A connection beyond the cap closes, at once, the one that has waited longest for its
  request to arrive (an idle one cannot keep a real scrape out), or itself when every held connection is
  being answered. Each connection so closed is counted (`reason="cap"`), as are those cut off by a deadline.
- `accept()` failing for want of descriptors backs off instead of spinning on the listening socket.

The answer is HTTP/1.0 (one request per connection, as prometheus_client serves it), so no connection idles
between requests.
"""

from __future__ import annotations

import errno
import io
import resource
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

IDLE_TIMEOUT_S = 10.0
HEADER_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
FD_SHARE = 4  # the exporter holds at most 1/FD_SHARE of the process's descriptors
ACCEPT_BACKOFF_S = 0.1  # after accept() found no descriptor free (EMFILE): the next try waits this long
_NO_DESCRIPTOR = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
DROP_REASONS = ("cap", "idle", "header")


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """What one client may hold of the exporter: see the module's docstring."""

    idle_timeout_s: float = IDLE_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS


def connection_cap(wanted: int) -> int:
    """`wanted`, lowered to a quarter of this process's soft RLIMIT_NOFILE (at least 1)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max(1, wanted)
    return max(1, min(wanted, soft // FD_SHARE))


class _Deadline(Exception):
    """The request head did not arrive before the header deadline."""


class _DeadlineReader(io.RawIOBase):
    """The connection's reads: each waits at most the idle timeout, and while `deadline` (monotonic) is set, at
    most what is left of it, so a request head that drips in a byte at a time still ends on time."""

    def __init__(self, sock: socket.socket, idle_s: float, deadline: float | None) -> None:
        super().__init__()
        self._sock, self._idle_s, self.deadline = sock, idle_s, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        wait = self._idle_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise _Deadline
            wait = min(wait, left)
        self._sock.settimeout(wait)
        try:
            return self._sock.recv_into(buf)
        except TimeoutError:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise _Deadline from None
            raise


class _Handler(WSGIRequestHandler):
    """One connection: its reads under the deadlines, its drops counted, nothing logged (a client's failure is
    the client's; the counters say how often)."""

    server: GuardedServer

    def setup(self) -> None:
        limits = self.server.limits
        self.timeout = limits.idle_timeout_s  # writes: sendall() must finish within it
        super().setup()
        self.rfile.close()  # the socket's own reader: closed, so that closing the socket really closes it
        self._reader = _DeadlineReader(self.connection, limits.idle_timeout_s,
                                       self.server.accepted_at(self.connection) + limits.header_timeout_s)
        self.rfile = io.BufferedReader(self._reader)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._reader.deadline = None
        self.connection.settimeout(self.server.limits.idle_timeout_s)  # the answer's writes: the idle deadline
        self.server.answering(self.connection)
        return ok

    def handle(self) -> None:
        try:
            super().handle()
        except _Deadline:
            self.server.count_drop("header")
        except TimeoutError:
            self.server.count_drop("idle")
        except OSError:  # reset, or hung up by the cap
            pass

    def get_stderr(self) -> io.StringIO:
        return io.StringIO()

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing (as prometheus_client's own handler)."""


class GuardedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, under ServeLimits; `stats()` says how it is going."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # a burst of connections waits in the backlog for accept() to close or serve them

    def __init__(self, host: str, port: int, app: Callable[..., Any], limits: ServeLimits) -> None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.address_family = family
        self.limits = limits
        self.cap = connection_cap(limits.max_connections)
        self._lock = threading.Lock()
        self._held: dict[socket.socket, float | None] = {}  # connection -> accept time until its request is in
        self._pushed: set[socket.socket] = set()  # hung up by the cap, their thread not ended yet
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        super().__init__((host, port), _Handler)
        self.set_app(app)

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as err:
            if err.errno in _NO_DESCRIPTOR:  # the listening socket stays readable: wait, do not spin
                time.sleep(ACCEPT_BACKOFF_S)
            raise

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Admit the connection under the cap, pushing out the one that has waited longest for its request;
        False (socketserver closes it at once) when every held connection is being answered."""
        with self._lock:
            if len(self._held) >= self.cap:
                self.dropped["cap"] += 1
                waiting = [(t, s) for s, t in self._held.items() if t is not None]
                if not waiting or len(self._pushed) >= self.cap:  # descriptors stay under twice the cap
                    return False
                _, oldest = min(waiting, key=lambda ts: ts[0])
                del self._held[oldest]
                self._pushed.add(oldest)
                _hang_up(oldest)
            self._held[request] = time.monotonic()
            return True

    def accepted_at(self, conn: socket.socket) -> float:
        with self._lock:
            return self._held.get(conn) or time.monotonic()

    def answering(self, conn: socket.socket) -> None:
        """The connection's request is in: it is no longer one the cap may push out."""
        with self._lock:
            if conn in self._held:
                self._held[conn] = None

    def count_drop(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] += 1

    def shutdown_request(self, request: Any) -> None:
        """Every connection ends here (served, refused, or its thread failed to start): it is held no more."""
        with self._lock:
            self._held.pop(request, None)
            self._pushed.discard(request)
        super().shutdown_request(request)

    def stats(self) -> tuple[int, int, dict[str, int]]:
        """(connections held now, the cap, drops by reason)."""
        with self._lock:
            return len(self._held) + len(self._pushed), self.cap, dict(self.dropped)

    def close_all(self) -> None:
        """Stop serving and hang up every connection still held."""
        self.shutdown()
        self.server_close()
        with self._lock:
            held, self._held = list(self._held), {}
        for conn in held:
            _hang_up(conn)


def _hang_up(conn: socket.socket) -> None:
    """End a connection another thread is reading: its read returns at once and that thread closes it."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def serve(host: str, port: int, app: Callable[..., Any], limits: ServeLimits) -> tuple[GuardedServer, threading.Thread]:
    """A GuardedServer for `app` on (host, port), serving on a daemon thread; OSError when it cannot bind."""
    server = GuardedServer(host, port, app, limits)
    thread = threading.Thread(target=server.serve_forever, name="gpudash-prometheus-http", daemon=True)
    thread.start()
    return server, thread
