"""Scraping llama-server and vLLM /metrics into ServerSamples (the telemetry source "servers").

The Prometheus text is read with prometheus_client's parser. llama-server resets its rate gauges
(`llamacpp:predicted_tokens_seconds`, ...) on every scrape, so `ServerSource` must be the only scraper.
Counters are kept cumulative; vLLM's token rate and mean TTFT are computed from the change since the
previous scrape of the same server process.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpudash.records import ServerSample

if TYPE_CHECKING:
    from gpudash.launcher.supervisor import Supervisor

SCRAPE_TIMEOUT_S = 0.3
SCRAPE_WORKERS = 8


def parse_metrics(text: str) -> dict[str, float]:
    """Flat {sample name: value}, labelled series of one name summed (vLLM labels per model/engine)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


@dataclass(frozen=True)
class _Prev:
    pid: int | None
    ts: float
    values: dict[str, float]


def _delta(cur: dict[str, float], prev: _Prev | None, pid: int | None, name: str) -> float | None:
    if prev is None or prev.pid != pid or name not in cur or name not in prev.values:
        return None
    d = cur[name] - prev.values[name]
    return d if d >= 0 else None  # a counter that went down means the process restarted


def llama_fields(m: dict[str, float]) -> dict[str, float | None]:
    """ServerSample fields from llama-server's `llamacpp:` metrics (prefix cache counted in prompt tokens)."""
    processed = m.get("llamacpp:prompt_tokens_total")
    cached = m.get("llamacpp:prompt_tokens_cached_total")
    drafted = m.get("llamacpp:spec_decode_num_draft_tokens_total")
    accepted = m.get("llamacpp:spec_decode_num_accepted_tokens_total")
    return {
        "tokens_per_s": m.get("llamacpp:predicted_tokens_seconds"),
        "prompt_tokens_per_s": m.get("llamacpp:prompt_tokens_seconds"),
        "requests_running": m.get("llamacpp:requests_processing"),
        "requests_waiting": m.get("llamacpp:requests_deferred"),
        "kv_cache_usage": m.get("llamacpp:kv_cache_usage_ratio"),
        "prefix_cache_queries": (processed + cached) if processed is not None and cached is not None else None,
        "prefix_cache_hits": cached,
        "draft_acceptance": (accepted / drafted) if drafted and accepted is not None else None,
    }


def vllm_fields(m: dict[str, float], prev: _Prev | None, pid: int | None, now: float) -> dict[str, float | None]:
    """ServerSample fields from vLLM's `vllm:` metrics; rates and mean TTFT over the last scrape interval."""
    fields: dict[str, float | None] = {
        "requests_running": m.get("vllm:num_requests_running"),
        "requests_waiting": m.get("vllm:num_requests_waiting"),
        "kv_cache_usage": m.get("vllm:kv_cache_usage_perc"),
        "prefix_cache_queries": m.get("vllm:prefix_cache_queries_total"),
        "prefix_cache_hits": m.get("vllm:prefix_cache_hits_total"),
    }
    dt = (now - prev.ts) if prev is not None else None
    gen = _delta(m, prev, pid, "vllm:generation_tokens_total")
    prompt = _delta(m, prev, pid, "vllm:prompt_tokens_total")
    fields["tokens_per_s"] = gen / dt if gen is not None and dt else None
    fields["prompt_tokens_per_s"] = prompt / dt if prompt is not None and dt else None
    n = _delta(m, prev, pid, "vllm:time_to_first_token_seconds_count")
    total = _delta(m, prev, pid, "vllm:time_to_first_token_seconds_sum")
    fields["ttft_mean_s"] = total / n if n and total is not None else None
    drafted = m.get("vllm:spec_decode_num_draft_tokens_total")
    accepted = m.get("vllm:spec_decode_num_accepted_tokens_total")
    fields["draft_acceptance"] = accepted / drafted if drafted and accepted is not None else None
    return fields


class ServerSource:
    """Telemetry source: the supervisor's process states plus each ready server's scraped /metrics.

    A server whose scrape fails this tick keeps its process state and has NA metrics; the error text
    goes into the snapshot's `errors`.
    """

    name = "servers"

    def __init__(self, supervisor: Supervisor, timeout_s: float = SCRAPE_TIMEOUT_S):
        self._sup = supervisor
        self._client = httpx.Client(timeout=timeout_s, trust_env=False)
        self._prev: dict[str, _Prev] = {}
        # Servers are scraped in parallel, so one slow server does not push the others past the tick.
        self._pool = ThreadPoolExecutor(max_workers=SCRAPE_WORKERS, thread_name_prefix="gpudash-scrape")

    def poll(self) -> dict[str, tuple]:
        states = self._sup.states()
        scrapes = {st.server: self._pool.submit(self._scrape, st) for st in states if st.state == "ready"}
        out = []
        errors = []
        for st in states:
            if st.server not in scrapes:
                out.append(st)
                continue
            try:
                out.append(scrapes[st.server].result())
            except (httpx.HTTPError, ValueError) as err:
                errors.append(f"{st.server}: /metrics scrape failed: {err}")
                out.append(st)
        result: dict[str, tuple] = {"servers": tuple(out)}
        if errors:
            result["errors"] = tuple(errors)
        return result

    def _scrape(self, st: ServerSample) -> ServerSample:
        base = self._sup.base_url(st.server)
        r = self._client.get(f"{base}/metrics")
        r.raise_for_status()
        now = time.time()
        m = parse_metrics(r.text)
        prev = self._prev.get(st.server)
        if st.kind == "vllm":
            fields = vllm_fields(m, prev, st.pid, now)
        else:
            fields = llama_fields(m)
        self._prev[st.server] = _Prev(st.pid, now, m)
        # Metrics win over the log's last line; the log still fills what a server does not export.
        merged = {k: v for k, v in fields.items() if v is not None}
        return replace(st, ts=now, **merged)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()
