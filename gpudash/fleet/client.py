"""A small client for Prometheus' HTTP API (/api/v1/query, /api/v1/query_range) with hard bounds.

A fleet view must never hang or swell because Prometheus is down, slow, behind something that answers
HTML, or returns far more than asked: every call has one deadline for the whole answer (connect, headers
and body), the body is read in pieces and refused past `max_bytes`, and whatever goes wrong becomes one
PrometheusError sentence naming the URL and what to check. Only the configured URL is ever contacted:
no proxy or .netrc from the environment, no redirects followed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from gpudash.config import prometheus_url

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 32 << 20  # 100 boxes of 8 GPUs answer in well under 1 MiB


class PrometheusError(Exception):
    """Prometheus could not be asked or did not answer usably; the message is one sentence."""


class PrometheusClient:
    """Instant and range queries against one Prometheus; `close()` frees the connection pool."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.url = prometheus_url(url)
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s), trust_env=False,
                                  follow_redirects=False, headers={"Accept": "application/json"})

    def close(self) -> None:
        self._http.close()

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
        return rows

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        body = bytearray()
        try:
            # POST, as Prometheus' API allows: a long query goes in a form body, not the URL
            with self._http.stream("POST", path, data=params) as r:
                for piece in r.iter_bytes():
                    body += piece
                    if len(body) > self.max_bytes:
                        raise PrometheusError(f"Prometheus at {self.url} answered more than "
                                              f"{self.max_bytes >> 20} MiB for one query; ask a narrower one")
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("deadline")
                status = r.status_code
        except httpx.TimeoutException:
            raise PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s; "
                                  "check it is up and not overloaded") from None
        except httpx.HTTPError as err:
            reason = str(err) or type(err).__name__
            raise PrometheusError(f"cannot reach Prometheus at {self.url} ({reason}); check the URL and that "
                                  "it is running") from None
        try:
            doc = json.loads(bytes(body))
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise PrometheusError(f"{self.url} answered {path} with HTTP {status} and no Prometheus JSON; is this "
                                  "Prometheus' base URL?")
        if doc["status"] == "error":
            raise PrometheusError(f"Prometheus at {self.url} refused the query: {str(doc.get('error'))[:200]}")
        return doc
