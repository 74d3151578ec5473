"""Scraping llama-server and vLLM /metrics into ServerSamples (the telemetry source "servers").

The Prometheus text is read with prometheus_client's parser. Rates (generated and computed prompt
tokens per second, mean TTFT, draft acceptance) come from the change of counters since the previous
scrape of the same server process, the same way for both server kinds. "Computed" prompt tokens leave
out prefix-cache hits: llama-server's `llamacpp:prompt_tokens_total` already does; vLLM's
`vllm:prompt_tokens_total` counts the whole prompt, so its local-compute share is used instead.
llama-server resets its rate gauges on every scrape, so `ServerSource` must be the only scraper.

vLLM with data parallelism exports one series per engine (`engine="0"`, `engine="1"`): counters and
request counts add up over engines, fractions (KV-cache usage, sleep state) are averaged; every DP engine
runs the same model on the same kind of GPU, so the plain mean is the capacity-weighted one.
Names of vLLM 0.8 (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_queries/hits`) are read when the
current ones are absent. llama-server no longer exports KV-cache usage; it is taken from /slots.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from gpudash.config import ServerSpec
from gpudash.launcher.scrape_http import Scraper, ScrapeError
from gpudash.records import ServerSample

if TYPE_CHECKING:
    from gpudash.launcher.supervisor import Supervisor

SCRAPE_TIMEOUT_S = 0.3  # per read
SCRAPE_DEADLINE_S = 0.6  # per whole answer: a tick scrapes twice (/metrics, /slots) within its second
SCRAPE_WORKERS = 8

# Labels that only say which model / DP engine (or histogram bucket) a series is; other labels (source, sleep_state,
# reason, ...) get their own key `name{label="value"}` besides the total under `name`.
_UNKEYED_LABELS = frozenset({"model_name", "engine", "le", "quantile"})
# Per-engine fractions: averaged over engines, never added up.
MEAN_GAUGES = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:engine_sleep_state"})
_LLAMA_UNIFIED_ON = frozenset({"-kvu", "--kv-unified"})
_LLAMA_UNIFIED_OFF = frozenset({"-no-kvu", "--no-kv-unified"})


def parse_metrics(text: str) -> dict[str, float]:
    """Flat {key: value}: each sample name under `name`, and per extra label under `name{label="value"}`;
    series of several engines are summed, those of MEAN_GAUGES averaged."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            keys = [s.name] + [f'{s.name}{{{k}="{v}"}}' for k, v in sorted(s.labels.items())
                               if k not in _UNKEYED_LABELS]
            for key in keys:
                sums[key] = sums.get(key, 0.0) + float(s.value)
                counts[key] = counts.get(key, 0) + 1
    return {k: (v / counts[k] if k.split("{", 1)[0] in MEAN_GAUGES else v) for k, v in sums.items()}


def first(m: dict[str, float], *names: str) -> float | None:
    """The value of the first name present (current name first, older releases' names after)."""
    return next((m[n] for n in names if n in m), None)


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


def _rate(m: dict[str, float], prev: _Prev | None, pid: int | None, now: float, name: str) -> float | None:
    d = _delta(m, prev, pid, name)
    dt = (now - prev.ts) if prev is not None else 0.0
    return d / dt if d is not None and dt > 0 else None


def _acceptance(m: dict[str, float], prev: _Prev | None, pid: int | None, drafted: str, accepted: str) -> float | None:
    """Accepted / drafted tokens over the last interval; None when nothing was drafted in it."""
    d = _delta(m, prev, pid, drafted)
    a = _delta(m, prev, pid, accepted)
    return a / d if d and a is not None else None


def llama_fields(m: dict[str, float], prev: _Prev | None = None, pid: int | None = None,
                 now: float = 0.0) -> dict[str, float | None]:
    """ServerSample fields from llama-server's `llamacpp:` metrics (prefix cache counted in prompt tokens)."""
    processed = m.get("llamacpp:prompt_tokens_total")
    cached = m.get("llamacpp:prompt_tokens_cached_total")
    return {
        "tokens_per_s": m.get("llamacpp:predicted_tokens_seconds"),
        "prompt_tokens_per_s": _rate(m, prev, pid, now, "llamacpp:prompt_tokens_total"),
        "requests_running": m.get("llamacpp:requests_processing"),
        "requests_waiting": m.get("llamacpp:requests_deferred"),
        "prefix_cache_queries": (processed + cached) if processed is not None and cached is not None else None,
        "prefix_cache_hits": cached,
        "draft_acceptance": _acceptance(m, prev, pid, "llamacpp:spec_decode_num_draft_tokens_total",
                                        "llamacpp:spec_decode_num_accepted_tokens_total"),
    }


def llama_kv_usage(slots: Sequence[dict[str, Any]], unified: bool) -> float | None:
    """KV cells in use from llama-server's /slots: the tokens each slot holds (its prompt plus what it
    generated, kept after the task for reuse) over the cells. With a unified KV buffer every slot reports
    the whole context as its n_ctx and they share it; otherwise each slot owns its n_ctx."""
    sizes = [s.get("n_ctx") for s in slots]
    if not sizes or not all(isinstance(n, int) and n > 0 for n in sizes):
        return None
    held = sum(int(s.get("n_prompt_tokens") or 0) for s in slots)
    cells = max(sizes) if unified else sum(sizes)
    return min(1.0, held / cells)


def llama_kv_unified(spec: ServerSpec) -> bool:
    """Whether llama-server runs one KV buffer for all slots: its default when the slot count is left to
    it (no `parallel`), unless extra_args say otherwise."""
    words = set(spec.extra_args)
    if words & _LLAMA_UNIFIED_OFF:
        return False
    return bool(words & _LLAMA_UNIFIED_ON) or spec.parallel is None


def vllm_fields(m: dict[str, float], prev: _Prev | None, pid: int | None, now: float) -> dict[str, Any]:
    """ServerSample fields from vLLM's `vllm:` metrics; rates and mean TTFT over the last scrape interval."""
    fields: dict[str, Any] = {
        "requests_running": m.get("vllm:num_requests_running"),
        "requests_waiting": m.get("vllm:num_requests_waiting"),
        "kv_cache_usage": first(m, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        # vLLM 0.8 counted these in blocks, later releases in tokens; their ratio is the hit rate either way.
        "prefix_cache_queries": first(m, "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_cache_hits": first(m, "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "tokens_per_s": _rate(m, prev, pid, now, "vllm:generation_tokens_total"),
        "prompt_tokens_per_s": _computed_prompt_rate(m, prev, pid, now),
    }
    n = _delta(m, prev, pid, "vllm:time_to_first_token_seconds_count")
    total = _delta(m, prev, pid, "vllm:time_to_first_token_seconds_sum")
    fields["ttft_mean_s"] = total / n if n and total is not None else None
    fields["draft_acceptance"] = _acceptance(m, prev, pid, "vllm:spec_decode_num_draft_tokens_total",
                                             "vllm:spec_decode_num_accepted_tokens_total")
    awake = m.get('vllm:engine_sleep_state{sleep_state="awake"}')  # mean over engines
    if awake is not None:  # a sleep or wake by anyone (another gpudash, curl) shows here
        fields["state"] = "sleeping" if awake < 1 else "ready"
    return fields


_LOCAL_COMPUTE = 'vllm:prompt_tokens_by_source_total{source="local_compute"}'


def _computed_prompt_rate(m: dict[str, float], prev: _Prev | None, pid: int | None, now: float) -> float | None:
    """Prompt tokens vLLM computed per second: its local-compute source, else all prompt tokens minus the
    cached ones; None on releases with neither (0.8), where the whole-prompt count would overstate it."""
    if _LOCAL_COMPUTE in m:
        return _rate(m, prev, pid, now, _LOCAL_COMPUTE)
    whole = _rate(m, prev, pid, now, "vllm:prompt_tokens_total")
    cached = _rate(m, prev, pid, now, "vllm:prompt_tokens_cached_total")
    return whole - cached if whole is not None and cached is not None else None


class ServerSource:
    """Telemetry source: the supervisor's process states plus each ready server's scraped /metrics.

    A server whose scrape fails this tick keeps its process state and has NA metrics; the error text
    goes into the snapshot's `errors`.
    """

    name = "servers"

    def __init__(self, supervisor: Supervisor, timeout_s: float = SCRAPE_TIMEOUT_S):
        self._sup = supervisor
        self._http = Scraper(timeout_s, SCRAPE_DEADLINE_S)
        self._prev: dict[str, _Prev] = {}
        # Servers are scraped in parallel, so one slow server does not push the others past the tick.
        self._pool = ThreadPoolExecutor(max_workers=SCRAPE_WORKERS, thread_name_prefix="gpudash-scrape")

    def poll(self) -> dict[str, tuple]:
        states = self._sup.states()
        scrapes = {st.server: self._pool.submit(self._scrape, st) for st in states
                   if st.state in ("ready", "sleeping")}
        out = []
        errors = []
        for st in states:
            if st.server not in scrapes:
                out.append(st)
                continue
            try:
                out.append(scrapes[st.server].result())
            except (ScrapeError, ValueError) as err:
                errors.append(f"{st.server}: /metrics scrape failed: {err}")
                out.append(st)
        result: dict[str, tuple] = {"servers": tuple(out)}
        if errors:
            result["errors"] = tuple(errors)
        return result

    def _scrape(self, st: ServerSample) -> ServerSample:
        base = self._sup.base_url(st.server)
        if base is None:
            raise ScrapeError("it has no port yet")
        status, body = self._http.get(base, "/metrics")
        if status != 200:
            raise ScrapeError(f"GET /metrics answered HTTP {status}")
        now = time.time()
        m = parse_metrics(body.decode("utf-8", "replace"))
        prev = self._prev.get(st.server)
        if st.kind == "vllm":
            fields = vllm_fields(m, prev, st.pid, now)
        else:
            fields = llama_fields(m, prev, st.pid, now)
            fields["kv_cache_usage"] = self._llama_kv(st.server, base)
        self._prev[st.server] = _Prev(st.pid, now, m)
        # Metrics win over the log's last line; the log still fills what a server does not export.
        merged = {k: v for k, v in fields.items() if v is not None}
        return replace(st, ts=now, **merged)

    def _llama_kv(self, server: str, base: str) -> float | None:
        """KV usage from /slots; None when the server has it off (--no-slots answers 501)."""
        try:
            status, body = self._http.get(base, "/slots")
            slots = json.loads(body) if status == 200 else None
        except (ScrapeError, ValueError):
            return None
        spec = self._sup.specs().get(server)
        if not isinstance(slots, list) or spec is None:
            return None
        return llama_kv_usage([s for s in slots if isinstance(s, dict)], llama_kv_unified(spec))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._http.close()
