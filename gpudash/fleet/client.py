"""A small client for Prometheus' HTTP API (/api/v1/query, /api/v1/query_range) with hard bounds.

A fleet view must never hang or swell because Prometheus is down, slow, dripping its answer, behind
something that answers HTML, or returns far more (or deeper) than asked: every call has one deadline from
connect to the last byte of the body (headers included: a server that sends one header byte every
0.2 s is cut off at it), the body is read in pieces and refused past `max_bytes`, and whatever goes wrong
becomes one PrometheusError sentence naming the URL and what to check. The deadline is asyncio's, around
an httpx request on its own event loop, so it interrupts any read, not only the gaps between body pieces.
Only the configured URL is ever contacted: no proxy or .netrc from the environment, no redirects followed.
Label values that are not strings (no Prometheus sends one) are dropped from the rows handed on.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import httpx

from gpudash.config import prometheus_url

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 32 << 20  # 100 boxes of 8 GPUs answer in well under 1 MiB


class PrometheusError(Exception):
    """Prometheus could not be asked or did not answer usably; the message is one sentence."""


class PrometheusClient:
    """Instant and range queries against one Prometheus; each call opens its own connection (so a call can
    be cut off at its deadline whatever it is waiting for) and may run in any thread without an event loop."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.url = prometheus_url(url)
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._tls: ssl.SSLContext | bool = httpx.create_ssl_context() if self.url.startswith("https:") else False

    def close(self) -> None:
        """Nothing is held between calls; kept so a client can be used as a context manager."""

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant vector: [{"metric": {...}, "value": [ts, "v"]}, ...]."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return self._result("/api/v1/query", params, "vector")

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """A range matrix: [{"metric": {...}, "values": [[ts, "v"], ...]}, ...]."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        return self._result("/api/v1/query_range", params, "matrix")

    def _result(self, path: str, params: dict[str, str], kind: str) -> list[dict[str, Any]]:
        doc = self._get(path, params)
        data = doc.get("data")
        if not isinstance(data, dict) or data.get("resultType") != kind or not isinstance(data.get("result"), list):
            raise PrometheusError(f"Prometheus at {self.url} answered {path} without a {kind} result; is it a "
                                  "Prometheus (or a compatible server)?")
        rows = data["result"]
        if not all(isinstance(r, dict) and isinstance(r.get("metric"), dict) for r in rows):
            raise PrometheusError(f"Prometheus at {self.url} answered {path} with malformed series")
        for r in rows:
            if not all(isinstance(v, str) for v in r["metric"].values()):
                r["metric"] = {k: v for k, v in r["metric"].items() if isinstance(v, str)}
        return rows

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        try:
            status, body = asyncio.run(self._fetch(path, params))
        except (TimeoutError, httpx.TimeoutException):
            raise PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s; "
                                  "check it is up and not overloaded") from None
        except httpx.HTTPError as err:
            reason = str(err) or type(err).__name__
            raise PrometheusError(f"cannot reach Prometheus at {self.url} ({reason}); check the URL and that "
                                  "it is running") from None
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

    async def _fetch(self, path: str, params: dict[str, str]) -> tuple[int, bytes]:
        """(HTTP status, body) of one POST (as Prometheus' API allows: a long query goes in a form body, not
        the URL), all of it within timeout_s."""
        async with asyncio.timeout(self.timeout_s):
            async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(self.timeout_s), verify=self._tls,
                                         trust_env=False, follow_redirects=False,
                                         headers={"Accept": "application/json"}) as http:
                async with http.stream("POST", path, data=params) as r:
                    body = bytearray()
                    async for piece in r.aiter_bytes():
                        body += piece
                        if len(body) > self.max_bytes:
                            raise PrometheusError(f"Prometheus at {self.url} answered more than "
                                                  f"{self.max_bytes >> 20} MiB for one query; ask a narrower one")
                    return r.status_code, bytes(body)
