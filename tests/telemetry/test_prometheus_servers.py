"""gpudash's server series beside the servers' own /metrics (real scrapes of a real sink): by default only
what a server does not export itself, `kind` on every server series and never the rig's `source` (a real
server on a simulated rig is real), a TTFT only as a histogram, and a state series that goes to 0 when the
server leaves that state, even when its kind became known meanwhile (an attached server is "unknown"
until it is read)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpudash.config import PrometheusConfig
from gpudash.launcher.kinds import KINDS
from gpudash.records import RequestSample, ServerSample, ServerState, Snapshot
from gpudash.telemetry.prom_servers import FIELDS
from gpudash.telemetry.prometheus import PrometheusSink

VLLM = ServerSample(1.0, "chat", "vllm", ServerState.READY, port=8000, tokens_per_s=42.0, prompt_tokens_per_s=900.0,
                    requests_running=3.0, requests_waiting=1.0, kv_cache_usage=0.7, prefix_cache_queries=1000.0,
                    prefix_cache_hits=600.0, external_prefix_cache_queries=10.0, external_prefix_cache_hits=5.0,
                    ttft_mean_s=0.2, ttft_p50_s=0.1, ttft_p90_s=0.3, ttft_p99_s=0.5, restarts=1, origin="attached",
                    url="http://127.0.0.1:8000", kv_cache_usage_engines=(0.6, 0.7), kv_capacity_tokens=65536.0,
                    preemptions=4.0, requests_finished=120.0, requests_aborted=3.0, requests_failed=1.0,
                    requests_rejected=2.0, requests_corrupted=0.0, requests_waiting_capacity=1.0,
                    ttft_buckets=(("0.1", 50.0), ("1.0", 110.0), ("+Inf", 120.0)), ttft_sum_s=31.5, ttft_count=120.0,
                    itl_mean_s=0.02, itl_p90_s=0.03, itl_p99_s=0.05, queue_mean_s=0.1, queue_p90_s=0.2,
                    e2e_mean_s=1.0, e2e_p90_s=2.0, prefill_mean_s=0.15)
LLAMA = ServerSample(1.0, "code", "llama.cpp", ServerState.READY, port=8080, tokens_per_s=30.0, requests_running=1.0,
                     requests_waiting=0.0, kv_cache_usage=0.25, prefix_cache_queries=500.0, prefix_cache_hits=200.0,
                     kv_capacity_tokens=8192.0, slot_states=((0, "decode", 300, 4096), (1, "idle", 0, 4096)),
                     slots_per_decode=1.0, max_sequence_tokens=507.0, prefill_busy=0.4)
PROBE = (RequestSample(0.0, "chat", ttft_s=0.3, total_s=0.5, prompt_tokens=100, cached_tokens=90),
         RequestSample(0.0, "code", ttft_s=None, total_s=0.1, prompt_tokens=None, cached_tokens=None, ok=False,
                       error="HTTP 503"))


def scrape(settings: PrometheusConfig, *snaps: Snapshot) -> dict:
    sink = PrometheusSink("127.0.0.1", 0, settings=settings)
    try:
        for snap in snaps:
            sink(snap)
        text = httpx.get(f"http://127.0.0.1:{sink.port}/metrics", trust_env=False).text
    finally:
        sink.close()
    return {f.name: f for f in text_string_to_metric_families(text)}


def server_values(fams: dict, name: str) -> dict[str, float]:
    return {s.labels["server"]: s.value for s in fams.get(name, ()).samples
            if not s.name.endswith("_created")} if name in fams else {}


def snap(ts: float, *servers: ServerSample, requests: tuple = ()) -> Snapshot:
    return Snapshot(ts, int(ts), "sim:h200", servers=servers, requests=requests)


def test_own_serves_only_what_the_server_does_not_export_itself() -> None:
    fams = scrape(PrometheusConfig(gpu="all"), snap(10.0, VLLM, LLAMA, requests=PROBE))
    family_of = {attr: name for attr, name, _, _ in FIELDS}
    family_of.update(kv_cache_usage_engines="gpudash_server_engine_kv_cache_usage_ratio",
                     ttft_buckets="gpudash_server_ttft_seconds")
    for server, kind in (("chat", "vllm"), ("code", "llama.cpp")):
        for field in KINDS[kind].own_series:
            assert server not in server_values(fams, family_of[field]), (server, field)
    assert "gpudash_server_requests_running" not in fams  # both servers export it themselves
    assert "gpudash_server_prefix_cache_hits" not in fams
    # what only gpudash knows: the rates it derives, llama-server's KV from /slots, state, restarts, the probe
    assert server_values(fams, "gpudash_server_generation_tokens_per_second") == {"chat": 42.0, "code": 30.0}
    assert server_values(fams, "gpudash_server_kv_cache_usage_ratio") == {"code": 0.25}
    # llama-server's prefill busy share (no time per request: its counter counts a shared batch once)
    assert server_values(fams, "gpudash_server_prefill_busy_ratio") == {"code": 0.4}
    # what gpudash reads from llama-server's /slots: its KV capacity and each slot's state
    assert server_values(fams, "gpudash_server_kv_cache_capacity_tokens") == {"code": 8192.0}
    slots = {s.labels["state"]: s.value for s in fams["gpudash_server_slots"].samples}
    assert slots == {"idle": 1, "prefill": 0, "decode": 1}
    for own in ("preemptions", "requests_failed", "requests_rejected", "busy_slots_per_decode",
                "max_sequence_tokens", "engine_kv_cache_usage_ratio", "ttft_seconds"):
        assert f"gpudash_server_{own}" not in fams, own  # the servers export these themselves
    assert server_values(fams, "gpudash_server_restarts")["chat"] == 1
    assert server_values(fams, "gpudash_server_up") == {"chat": 1.0, "code": 1.0}
    (info,) = [s for s in fams["gpudash_server_info"].samples if s.labels["server"] == "chat"]
    assert info.labels == {"server": "chat", "kind": "vllm", "origin": "attached", "port": "8000"}
    prompt = server_values(fams, "gpudash_server_probe_prompt_tokens")
    cached = server_values(fams, "gpudash_server_probe_prompt_tokens_cached")
    assert prompt == {"chat": 100} and cached == {"chat": 90}


def test_all_re_exports_the_servers_own_figures_too() -> None:
    fams = scrape(PrometheusConfig(gpu="all", servers="all"), snap(10.0, VLLM, LLAMA))
    assert server_values(fams, "gpudash_server_requests_running") == {"chat": 3.0, "code": 1.0}
    assert server_values(fams, "gpudash_server_kv_cache_usage_ratio") == {"chat": 0.7, "code": 0.25}
    assert server_values(fams, "gpudash_server_prefix_cache_hits")["chat"] == 600.0
    for name, value in (("preemptions", 4.0), ("requests_aborted", 3.0), ("requests_failed", 1.0),
                        ("requests_rejected", 2.0), ("requests_finished", 120.0)):
        assert server_values(fams, f"gpudash_server_{name}") == {"chat": value}, name
        assert fams[f"gpudash_server_{name}"].type == "counter", name
    assert server_values(fams, "gpudash_server_kv_cache_capacity_tokens") == {"chat": 65536.0, "code": 8192.0}
    engines = {s.labels["engine"]: s.value for s in fams["gpudash_server_engine_kv_cache_usage_ratio"].samples}
    assert engines == {"0": 0.6, "1": 0.7}
    ttft = fams["gpudash_server_ttft_seconds"]  # the server's own TTFT, a histogram as it counts it
    assert ttft.type == "histogram"
    got = {(s.name, s.labels.get("le")): s.value for s in ttft.samples}
    assert got[("gpudash_server_ttft_seconds_bucket", "0.1")] == 50
    assert got[("gpudash_server_ttft_seconds_sum", None)] == 31.5
    assert got[("gpudash_server_ttft_seconds_bucket", "+Inf")] == 120 == got[("gpudash_server_ttft_seconds_count", None)]


def test_every_server_series_has_kind_and_none_has_source_nor_a_quantile_gauge() -> None:
    fams = scrape(PrometheusConfig(gpu="all", servers="all"), snap(10.0, VLLM, LLAMA, requests=PROBE))
    server_families = [f for n, f in fams.items() if n.startswith("gpudash_server_")]
    assert len(server_families) >= 14
    for fam in server_families:
        for s in fam.samples:
            assert "kind" in s.labels and "server" in s.labels, fam.name
            assert "source" not in s.labels, fam.name
        assert not any(word in fam.name for word in ("p50", "p90", "p99", "quantile", "mean")), fam.name
        assert fam.type != "summary", fam.name
    assert fams["gpudash_server_probe_ttft_seconds"].type == "histogram"
    (failed,) = [s for s in fams["gpudash_server_probe_failed_requests"].samples if s.name.endswith("_total")]
    assert failed.labels == {"server": "code", "kind": "llama.cpp"} and failed.value == 1


def test_an_unreachable_state_goes_to_0_when_the_server_comes_back_as_its_kind() -> None:
    """Attached, never read yet: kind "unknown", unreachable. Then it answers as vLLM: the series
    {kind="unknown", state="unreachable"} stays, at 0, beside {kind="vllm", state="ready"} at 1."""
    down = ServerSample(1.0, "chat", "unknown", ServerState.UNREACHABLE, origin="attached", url="http://127.0.0.1:8000")
    fams = scrape(PrometheusConfig(gpu="all"), snap(1.0, down), snap(2.0, VLLM))
    states = {(s.labels["kind"], s.labels["state"]): s.value for s in fams["gpudash_server_state"].samples}
    assert states[("unknown", "unreachable")] == 0
    assert states[("vllm", "ready")] == 1 and states[("vllm", "unreachable")] == 0
    assert sum(states.values()) == 1
    assert {s.labels["kind"] for s in fams["gpudash_server_up"].samples} == {"vllm"}  # up: its kind now only
    before = scrape(PrometheusConfig(gpu="all"), snap(1.0, down))
    states = {(s.labels["kind"], s.labels["state"]): s.value for s in before["gpudash_server_state"].samples}
    assert states[("unknown", "unreachable")] == 1
