"""A small client for Prometheus' HTTP API (/api/v1/query, /api/v1/query_range) with hard bounds.

A fleet view must never hang or swell because Prometheus is down, slow, dripping its answer, behind
something that answers HTML, or returns far more (or deeper) than asked: every call has one deadline from
connect to the last byte of the body (headers included: a server that sends one header byte every
0.2 s is cut off at it), the body is read in pieces and refused past `max_bytes`, and whatever goes wrong
becomes one PrometheusError sentence naming the URL and what to check. The deadline is asyncio's, around
an httpx request on the client's own event loop (a thread of its own, which keeps the connection alive
between calls), so it interrupts any read, not only the gaps between body pieces.
Only the configured URL is ever contacted: no proxy or .netrc from the environment, no redirects followed.
Label values that are not strings (no Prometheus sends one) are dropped from the rows handed on.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from contextlib import aclosing
from typing import Any

import httpx

from gpudash.config import prometheus_url

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 32 << 20  # 100 boxes of 8 GPUs answer in well under 1 MiB


class PrometheusError(Exception):
    """Prometheus could not be asked or did not answer usably; the message is one sentence."""


class PrometheusClient:
    """Instant and range queries against one Prometheus, from any thread; `close()` ends its event loop and
    connection."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.url = prometheus_url(url)
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._tls: ssl.SSLContext | bool = httpx.create_ssl_context() if self.url.startswith("https:") else False
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._http: httpx.AsyncClient | None = None

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        try:
            if self._http is not None:
                asyncio.run_coroutine_threadsafe(self._http.aclose(), loop).result(timeout=5)
            asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(timeout=5)
        except TimeoutError:  # a connection that will not close in time is left to the daemon thread
            pass
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _running(self) -> asyncio.AbstractEventLoop:
        """The client's event loop, started on first use in a daemon thread."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="gpudash-prometheus", daemon=True)
                self._thread.start()
            return self._loop

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant vector: [{"metric": {...}, "value": [ts, "v"]}, ...]."""
        return self.query_all([expr], at)[0]

    def query_all(self, exprs: list[str], at: float | None = None) -> list[list[dict[str, Any]]]:
        """The instant vectors of several expressions, asked side by side (Prometheus evaluates them at once),
        all within one timeout."""
        params = [{"query": e} if at is None else {"query": e, "time": f"{at:.3f}"} for e in exprs]
        return [self._rows("/api/v1/query", doc, "vector") for doc in self._get("/api/v1/query", params)]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """A range matrix: [{"metric": {...}, "values": [[ts, "v"], ...]}, ...]."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        (doc,) = self._get("/api/v1/query_range", [params])
        return self._rows("/api/v1/query_range", doc, "matrix")

    def _rows(self, path: str, doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        data = doc.get("data")
        if not isinstance(data, dict) or data.get("resultType") != kind or not isinstance(data.get("result"), list):
            raise PrometheusError(f"Prometheus at {self.url} answered {path} without a {kind} result; is it a "
                                  "Prometheus (or a compatible server)?")
        rows = data["result"]
        if not all(isinstance(r, dict) and isinstance(r.get("metric"), dict) for r in rows):
            raise PrometheusError(f"Prometheus at {self.url} answered {path} with malformed series")
        for r in rows:
            for v in r["metric"].values():
                if type(v) is not str:  # (a loop, not all(): this runs for every label of every row)
                    r["metric"] = {k: v for k, v in r["metric"].items() if isinstance(v, str)}
                    break
        return rows

    def _get(self, path: str, params: list[dict[str, str]]) -> list[dict[str, Any]]:
        answer = asyncio.run_coroutine_threadsafe(self._fetch_all(path, params), self._running())
        try:
            answers = answer.result(self.timeout_s + 5)  # the deadline is kept inside; this is a backstop
        except (TimeoutError, httpx.TimeoutException):
            answer.cancel()
            raise PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s; "
                                  "check it is up and not overloaded") from None
        except httpx.HTTPError as err:
            reason = str(err) or type(err).__name__
            raise PrometheusError(f"cannot reach Prometheus at {self.url} ({reason}); check the URL and that "
                                  "it is running") from None
        return [self._doc(path, status, body) for status, body in answers]

    def _doc(self, path: str, status: int, body: bytes) -> dict[str, Any]:
        try:
            doc = json.loads(body)
        except RecursionError:
            raise PrometheusError(f"{self.url} answered {path} with JSON nested too deeply to be Prometheus'; "
                                  "is this Prometheus' base URL?") from None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise PrometheusError(f"{self.url} answered {path} with HTTP {status} and no Prometheus JSON; is this "
                                  "Prometheus' base URL?")
        if doc["status"] == "error":
            raise PrometheusError(f"Prometheus at {self.url} refused the query: {str(doc.get('error'))[:200]}")
        return doc

    async def _fetch_all(self, path: str, params: list[dict[str, str]]) -> list[tuple[int, bytes]]:
        """Every request at once, all of them within timeout_s; the first failure cancels the others."""
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(self.timeout_s), verify=self._tls,
                                           trust_env=False, follow_redirects=False,
                                           headers={"Accept": "application/json"})
        tasks = [asyncio.ensure_future(self._fetch(self._http, path, p)) for p in params]
        try:
            async with asyncio.timeout(self.timeout_s):
                return list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()

    async def _fetch(self, http: httpx.AsyncClient, path: str, params: dict[str, str]) -> tuple[int, bytes]:
        """(HTTP status, body) of one POST (as Prometheus' API allows: a long query goes in a form body, not
        the URL), refused past max_bytes."""
        async with http.stream("POST", path, data=params) as r, aclosing(r.aiter_bytes()) as pieces:
            body = bytearray()  # (aclosing: a piece past the cap must not leave the generator to the loop's end)
            async for piece in pieces:
                body += piece
                if len(body) > self.max_bytes:
                    raise PrometheusError(f"Prometheus at {self.url} answered more than "
                                          f"{self.max_bytes >> 20} MiB for one query; ask a narrower one")
            return r.status_code, bytes(body)
