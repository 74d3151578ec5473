"""The per-tick scraper against real local HTTP servers: kept-alive connections, servers that close,
drip or flood their answers, and a server that is gone."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from gpudash.launcher.health import free_port
from gpudash.launcher.scrape_http import MAX_BODY_BYTES, Scraper, ScrapeError


class Counted(http.server.BaseHTTPRequestHandler):
    connections = 0

    def setup(self) -> None:
        type(self).connections += 1
        super().setup()

    def do_GET(self) -> None:
        body = f"path {self.path}".encode()
        self.send_response(200 if self.path != "/missing" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a) -> None:
        pass


def serve(handler: type, protocol: str) -> tuple[str, http.server.ThreadingHTTPServer]:
    handler.protocol_version = protocol
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}", srv


@pytest.mark.parametrize("protocol, connections", [("HTTP/1.1", 1), ("HTTP/1.0", 3)])
def test_answers_over_kept_alive_or_fresh_connections(protocol: str, connections: int) -> None:
    handler = type("H", (Counted,), {"connections": 0})
    base, srv = serve(handler, protocol)
    scraper = Scraper(timeout_s=1.0, deadline_s=2.0)
    try:
        assert scraper.get(base, "/metrics") == (200, b"path /metrics")
        assert scraper.get(base, "/slots") == (200, b"path /slots")
        assert scraper.get(base, "/missing") == (404, b"path /missing")
        assert handler.connections == connections  # HTTP/1.1: one connection for the three
    finally:
        scraper.close()
        srv.shutdown()


def raw_server(answer) -> tuple[str, socket.socket]:
    """A listener whose every connection gets `answer(conn)` after the request line is read."""
    lsock = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            conn.recv(4096)
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{lsock.getsockname()[1]}", lsock


def drip(conn: socket.socket) -> None:
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):
            conn.sendall(b"x")
            time.sleep(0.05)
    except OSError:
        pass


def flood(conn: socket.socket) -> None:
    n = 4 * MAX_BODY_BYTES
    try:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n".encode())
        conn.sendall(b"\0" * n)
    except OSError:
        pass


@pytest.mark.parametrize("answer, message", [(drip, "no whole answer within 0.5 s"), (flood, "over 8 MiB")])
def test_a_server_that_drips_or_floods_is_cut_off(answer, message: str) -> None:
    base, lsock = raw_server(answer)
    scraper = Scraper(timeout_s=0.3, deadline_s=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(ScrapeError, match=message):
            scraper.get(base, "/metrics")
        assert time.monotonic() - t0 < 0.5 + 0.3 + 0.5  # the deadline, one more read, slack
    finally:
        scraper.close()
        lsock.close()


def test_a_server_that_is_gone_then_back() -> None:
    port = free_port("127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    scraper = Scraper(timeout_s=0.3, deadline_s=0.5)
    with pytest.raises(ScrapeError, match="GET /metrics"):
        scraper.get(base, "/metrics")
    handler = type("H", (Counted,), {"connections": 0})
    handler.protocol_version = "HTTP/1.1"
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert scraper.get(base, "/metrics") == (200, b"path /metrics")  # a new connection after the failure
    finally:
        scraper.close()
        srv.shutdown()
