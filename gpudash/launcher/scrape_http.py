"""GET a server's /metrics and /slots each tick, cheaply: one kept-alive http.client connection per server.

httpx spends four times the CPU of the standard library's http.client on a request (dev VM against the
demo llama-server: 0.64 vs 0.17 ms for a tick's two requests, median of 300), and at a 1 s refresh the
scrape was the largest cost of watching after the screen itself (0.3% of a core on the H200 box). Each
read waits at most `timeout_s`, the whole answer `deadline_s`, and a body is capped, so a server that
drips or floods its answer cannot hold the tick. A failed request drops its connection; the next one
opens a new one.
"""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

MAX_BODY_BYTES = 8 << 20  # a llama-server's /slots with many slots is tens of KB; vLLM's /metrics ~100 KB
READ_BYTES = 64 << 10


class ScrapeError(Exception):
    """One request failed; the message says why in one line."""


class Scraper:
    """Thread-safe: a connection serves one request at a time (another thread opens its own)."""

    def __init__(self, timeout_s: float, deadline_s: float) -> None:
        self._timeout_s = timeout_s
        self._deadline_s = deadline_s
        self._idle: dict[tuple[str, str, int], http.client.HTTPConnection] = {}
        self._lock = threading.Lock()

    def get(self, base_url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(HTTP status, body) of GET base_url + path (http or https); ScrapeError when no answer came."""
        url = urlsplit(base_url)
        if url.hostname is None:
            raise ScrapeError(f"{base_url} names no host")
        tls = url.scheme == "https"
        key = (url.scheme, url.hostname, url.port or (443 if tls else 80))
        with self._lock:
            conn = self._idle.pop(key, None)
        if conn is None:
            cls = http.client.HTTPSConnection if tls else http.client.HTTPConnection
            conn = cls(key[1], key[2], timeout=self._timeout_s)
        try:
            answer = self._exchange(conn, path, headers or {})
        except (OSError, http.client.HTTPException, ScrapeError) as err:
            conn.close()
            if isinstance(err, ScrapeError):
                raise
            raise ScrapeError(f"GET {path}: {err or type(err).__name__}") from err
        with self._lock:
            spare = self._idle.setdefault(key, conn)
        if spare is not conn:
            conn.close()
        return answer

    def _exchange(self, conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        deadline = time.monotonic() + self._deadline_s
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = bytearray()
        while chunk := response.read1(READ_BYTES):  # what has arrived: the deadline is checked between reads
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ScrapeError(f"GET {path}: the answer is over {MAX_BODY_BYTES >> 20} MiB")
            if time.monotonic() > deadline:
                raise ScrapeError(f"GET {path}: no whole answer within {self._deadline_s:g} s")
        response.close()  # the whole body is in: the connection may carry the next request
        return response.status, bytes(body)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for conn in idle:
            conn.close()
