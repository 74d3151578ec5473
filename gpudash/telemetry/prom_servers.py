"""The server series of gpudash's Prometheus exposition: what a server does not export itself.

A vLLM or llama-server already serves its own /metrics, which Prometheus scrapes; gpudash re-exporting
them gave two series of one figure under two names. By default (`[prometheus] servers = "own"`) gpudash
serves only what it alone knows: each server's state (one series per state, 0 or 1), up, restarts and
relaunches, the rates it derives from the server's counters, what it reads from /slots (llama-server's KV
use and capacity, its slots' states), and its probe requests (TTFT as a histogram by how the prompt was
served, prompt tokens and those found cached, failures with the last error, every secret gpudash knows
masked: redact.mask_text). The fields a kind copies from the server's own series (its `own_series`) join
them under "all", with the server's TTFT as the histogram it counts and each DP engine's KV use. Every
series carries `server` and `kind`; none carries the rig's `source`, since a server's figures are real
even on a simulated rig. A latency is only ever a histogram: the views' quantiles and means over the last
minute (TTFT, ITL, queue, end to end, prefill) are not served, since no query could aggregate them over
servers or time; vLLM serves those histograms itself (gpudash keeps only TTFT's buckets to re-export).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from gpudash.launcher.counters import RATE_WINDOW_S, WINDOW_S
from gpudash.launcher.kinds import KINDS
from gpudash.launcher.probe.cache_kinds import GRACE_S, RESTORE_EVENT, classify
from gpudash.records import RequestSample, ServerEnergySample, ServerSample, ServerState, Snapshot
from gpudash.redact import MASK, mask_text
from gpudash.telemetry.prom_build import Families

# (record field, metric name, help, counter) of every server figure gpudash exports.
FIELDS = (
    ("tokens_per_s", "gpudash_server_generation_tokens_per_second",
     f"Generated tokens per second over the last {RATE_WINDOW_S:g} s of the server's counters (it updates them "
     "between batches); rate(gpudash_server_generation_tokens_total) for any other window.", False),
    ("prompt_tokens_per_s", "gpudash_server_prompt_tokens_per_second",
     f"Computed prompt tokens per second over the last {RATE_WINDOW_S:g} s (prefix-cache hits left out, for "
     "llama.cpp and vLLM alike).", False),
    ("prefill_busy", "gpudash_server_prefill_busy_ratio",
     f"Share of the last {WINDOW_S:g} s llama-server spent evaluating prompts (its prompt_seconds_total: a "
     "batch shared by several requests counts once, so this is no time per request).", False),
    ("draft_acceptance", "gpudash_server_draft_acceptance_ratio", "Speculative draft tokens accepted, 0..1.", False),
    ("requests_running", "gpudash_server_requests_running", "Requests being processed.", False),
    ("requests_waiting", "gpudash_server_requests_waiting", "Requests queued.", False),
    ("kv_cache_usage", "gpudash_server_kv_cache_usage_ratio", "KV cache in use, 0..1.", False),
    ("prefix_cache_queries", "gpudash_server_prefix_cache_queries",
     "Prompt tokens (vLLM 0.8: blocks) looked up in the prefix cache.", True),
    ("prefix_cache_hits", "gpudash_server_prefix_cache_hits", "Prefix-cache lookups that hit.", True),
    ("external_prefix_cache_queries", "gpudash_server_external_prefix_cache_queries",
     "Prompt tokens looked up in the host-memory KV cache after the GPU prefix cache missed (vLLM KV offload).",
     True),
    ("external_prefix_cache_hits", "gpudash_server_external_prefix_cache_hits",
     "Host-memory KV cache lookups that hit (vLLM KV offload).", True),
    ("restarts", "gpudash_server_restarts", "Restarts after a crash since launch.", True),
    ("relaunches", "gpudash_server_relaunches", "Re-launches an operator asked for.", True),
    ("kv_capacity_tokens", "gpudash_server_kv_cache_capacity_tokens",
     "KV cache size in tokens (vLLM's cache_config_info; llama-server: its slots' cells).", False),
    ("requests_waiting_capacity", "gpudash_server_requests_waiting_for_capacity",
     "Requests waiting for KV-cache or scheduling capacity.", False),
    ("slots_per_decode", "gpudash_server_busy_slots_per_decode", "Busy slots per decode call (batching).", False),
    ("max_sequence_tokens", "gpudash_server_max_sequence_tokens", "The longest sequence seen, in tokens.", False),
    ("preemptions", "gpudash_server_preemptions", "Requests preempted (their KV cache given to others).", True),
    ("requests_finished", "gpudash_server_requests_finished", "Requests finished, for any reason.", True),
    ("requests_aborted", "gpudash_server_requests_aborted", "Requests the client aborted.", True),
    ("requests_failed", "gpudash_server_requests_failed", "Requests ended by a server error.", True),
    ("requests_rejected", "gpudash_server_requests_rejected", "Requests refused at admission (a queue limit).",
     True),
    ("requests_corrupted", "gpudash_server_requests_corrupted", "Requests whose logits went NaN.", True),
)
# A llama-server slot's states (gpudash reads them from /slots): each gets a series, 0 when no slot is in it.
SLOT_STATES = ("idle", "prefill", "decode")
# Every state a live server can be in: each gets a series (1 for the current one, else 0), so a change of
# state never starts or ends a series and `gpudash_server_state{state="backoff"} == 1` is an alert expression.
STATES = tuple(s for s in ServerState if s is not ServerState.UNKNOWN)
# TTFT buckets: from an in-slot hit on a small model (tens of ms) to a long prompt computed anew.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0)
PENDING_MAX = 10_000  # probe requests waiting for their restore line; a flood beyond it is counted now
ERROR_CHARS = 200


class Histogram:
    """Cumulative buckets, sum and count of one series."""

    __slots__ = ("bounds", "buckets", "total", "count")

    def __init__(self, bounds: Sequence[float] = TTFT_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.buckets = [0] * len(self.bounds)
        self.total = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        for i, le in enumerate(self.bounds):
            if v <= le:
                self.buckets[i] += 1
        self.total += v
        self.count += 1

    def add_to(self, fam: HistogramMetricFamily, labels: list[str]) -> None:
        buckets = [(repr(le), n) for le, n in zip(self.bounds, self.buckets)] + [("+Inf", self.count)]
        fam.add_metric(labels, buckets, sum_value=self.total)


def server_port(s: ServerSample) -> str:
    """The port a server listens on (a launched one's, or its URL's), "" when unknown: what a Prometheus that
    scrapes the server itself has in its `instance`, so the two can be matched."""
    if s.port:
        return str(s.port)
    try:
        port = urlsplit(s.url or "").port
    except ValueError:
        return ""
    return str(port) if port else ""


def own_fields(kind: str) -> Mapping[str, str]:
    """The fields that kind copies from the server's own series (none for a kind not known yet)."""
    k = KINDS.get(kind)
    return k.own_series if k is not None else {}


class ServerFamilies:
    """Builds the server series from each Snapshot, and what accumulates across ticks: the probe's TTFT
    histograms and token counts, its failures and last error, and every kind a server was exported under.

    A probe request waits GRACE_S after its end for the log line that marks a host-cache restore, then
    cache_kinds.classify names it slot, restore or miss (unknown where its cache use is not reported)."""

    def __init__(self, every: bool = False) -> None:
        self.every = every  # servers = "all": the server's own figures too
        self.lock = threading.Lock()
        self.ttft: dict[tuple[str, str], Histogram] = {}
        self.probe_tokens: dict[str, list[int]] = {}  # server -> [prompt tokens, of them cached]
        self.probe_failed: dict[str, int] = {}
        self.probe_error: dict[str, str] = {}
        self.kinds: dict[str, dict[str, None]] = {}  # server -> every kind it was exported under, in order
        self._pending: deque[RequestSample] = deque()
        self._restores: deque[Any] = deque(maxlen=1000)

    def add(self, snap: Snapshot) -> None:
        with self.lock:
            for s in snap.servers:
                self.kinds.setdefault(s.server, {})[s.kind] = None
            self._restores.extend(e for e in snap.events if e.kind == RESTORE_EVENT)
            for r in snap.requests:
                if r.ok:
                    if r.ttft_s is not None:
                        self._pending.append(r)
                    if r.prompt_tokens:
                        counts = self.probe_tokens.setdefault(r.server, [0, 0])
                        counts[0] += r.prompt_tokens
                        counts[1] += min(r.cached_tokens or 0, r.prompt_tokens)
                else:
                    self.probe_failed[r.server] = self.probe_failed.get(r.server, 0) + 1
                    # a key a server echoes in its error body must never become a label value
                    self.probe_error[r.server] = mask_text(r.error or "unknown")[:ERROR_CHARS]
            self._settle(snap.ts)

    def _settle(self, now: float) -> None:
        ready = []
        while self._pending and (len(self._pending) > PENDING_MAX or _ended(self._pending[0]) + GRACE_S <= now):
            ready.append(self._pending.popleft())
        for r, kind in zip(ready, classify(ready, self._restores)):
            key = (r.server, kind or "unknown")
            hist = self.ttft.get(key)
            if hist is None:
                hist = self.ttft[key] = Histogram()
            hist.observe(float(r.ttft_s or 0.0))

    def families(self, f: Families, servers: Sequence[ServerSample]) -> None:
        with self.lock:
            kinds = {s: list(k) for s, k in self.kinds.items()}
            for s in servers:
                self._server(f, s, kinds.get(s.server, [s.kind]))
            self._probe(f, {s: k[-1] for s, k in kinds.items()})

    def _server(self, f: Families, s: ServerSample, kinds: list[str]) -> None:
        labels = {"server": s.server, "kind": s.kind}
        own = () if self.every else own_fields(s.kind)
        for attr, name, doc, counter in FIELDS:
            value = getattr(s, attr)
            if value is not None and attr not in own:
                f.value(CounterMetricFamily if counter else GaugeMetricFamily, name, doc, labels, value,
                        sourced=False)
        if s.slot_states is not None:  # what gpudash reads from llama-server's /slots, in every mode
            for state in SLOT_STATES:
                f.value(GaugeMetricFamily, "gpudash_server_slots", "Slots in each state (llama-server's /slots).",
                        {**labels, "state": state}, sum(1 for slot in s.slot_states if slot[1] == state),
                        sourced=False)
        if self.every:
            self._own_copies(f, s, labels)
        f.value(GaugeMetricFamily, "gpudash_server_info", "The server: how gpudash knows it (origin: managed, "
                "attached, found) and the port it listens on (value 1).",
                {**labels, "origin": s.origin, "port": server_port(s)}, 1, sourced=False)
        f.value(GaugeMetricFamily, "gpudash_server_up", "1 while the server answers (ready or sleeping; a found "
                "one: its /health says 200).", labels, s.up, sourced=False)
        # Under each kind the server was ever exported as (an attached server is "unknown" until it is read):
        # 1 for its state under its kind now, 0 for every other, so a series goes to 0 and never just ends.
        for kind in kinds:
            for state in STATES:
                f.value(GaugeMetricFamily, "gpudash_server_state", "1 for the state the server is in, else 0.",
                        {"server": s.server, "kind": kind, "state": state.value},
                        kind == s.kind and s.state is state, sourced=False)

    @staticmethod
    def _own_copies(f: Families, s: ServerSample, labels: dict[str, str]) -> None:
        """Under "all": the server's own figures that are not one number, as it exports them: each DP engine's
        KV use, and its TTFT as a histogram (never as quantiles)."""
        for engine, usage in enumerate(s.kv_cache_usage_engines or ()):
            f.value(GaugeMetricFamily, "gpudash_server_engine_kv_cache_usage_ratio",
                    "KV cache in use per data-parallel engine, 0..1.", {**labels, "engine": str(engine)}, usage,
                    sourced=False)
        if s.ttft_buckets and s.ttft_sum_s is not None:
            fam = f.family(HistogramMetricFamily, "gpudash_server_ttft_seconds",
                           "Time to first token of every request the server served (its own histogram).",
                           ["server", "kind"], sourced=False)
            buckets = [(le, n) for le, n in s.ttft_buckets]
            if buckets[-1][0] != "+Inf":
                buckets.append(("+Inf", s.ttft_count or buckets[-1][1]))
            fam.add_metric(list(labels.values()), buckets, sum_value=s.ttft_sum_s)

    def _probe(self, f: Families, kind_of: dict[str, str]) -> None:
        def labels(server: str) -> dict[str, str]:
            return {"server": server, "kind": kind_of.get(server, "unknown")}

        for server, n in sorted(self.probe_failed.items()):
            f.value(CounterMetricFamily, "gpudash_server_probe_failed_requests",
                    "Probe requests that failed (they never count as missing TTFT).", labels(server), n, sourced=False)
            f.value(GaugeMetricFamily, "gpudash_server_probe_last_error_info",
                    "The last error a failed probe request ended with (secrets masked as " + MASK + ").",
                    {**labels(server), "error": self.probe_error[server]}, 1, sourced=False)
        for server, (prompt, cached) in sorted(self.probe_tokens.items()):
            f.value(CounterMetricFamily, "gpudash_server_probe_prompt_tokens",
                    "Prompt tokens of the probe requests that succeeded.", labels(server), prompt, sourced=False)
            f.value(CounterMetricFamily, "gpudash_server_probe_prompt_tokens_cached",
                    "Of those, the tokens the server found in its prefix cache.", labels(server), cached,
                    sourced=False)
        if self.ttft:
            fam = f.family(HistogramMetricFamily, "gpudash_server_probe_ttft_seconds",
                           "Time to first token of the requests gpudash measured (probe), by how the prompt was "
                           "served: slot (in-slot hit), restore (host cache), miss, unknown.",
                           ["server", "kind", "cache"], sourced=False)
            for (server, cache), h in sorted(self.ttft.items()):
                h.add_to(fam, [server, kind_of.get(server, "unknown"), cache])


def energy_families(f: Families, energy: Sequence[ServerEnergySample], servers: Sequence[ServerSample]) -> None:
    """Each server's energy (busy and idle, under the split that gave it) and its tokens, as counters gpudash
    keeps over the same ticks, so `rate(energy) / rate(tokens)` is joules per token in PromQL. The servers'
    own token counters (vllm:generation_tokens_total, llamacpp:tokens_predicted_total) count since the server
    started and carry the server's scrape labels, not `server`, so they cannot be divided by these."""
    kinds = {s.server: s.kind for s in servers}
    for e in energy:
        labels = {"server": e.server, "kind": kinds.get(e.server, "unknown")}
        for state, joules in (("busy", e.busy_j), ("idle", e.idle_j)):
            f.value(CounterMetricFamily, "gpudash_server_energy_joules", "Energy of the GPUs the server runs on, "
                    "its share of each (split: whole_gpu, or sm_share of a shared GPU), while a request was in "
                    "flight (busy) or not (idle).", {**labels, "state": state, "split": e.split}, joules,
                    sourced=False)
        f.value(CounterMetricFamily, "gpudash_server_generation_tokens", "Tokens the server generated, counted "
                "over the same ticks as its energy.", labels, e.generation_tokens, sourced=False)
        f.value(CounterMetricFamily, "gpudash_server_prompt_tokens", "Prompt tokens the server computed (prefix-"
                "cache hits left out), counted over the same ticks as its energy.", labels, e.prompt_tokens,
                sourced=False)


def _ended(r: RequestSample) -> float:
    return r.ts + (r.total_s or r.ttft_s or 0.0)
