"""Probe and /metrics scrape against real llama-server: cache hits show as cache_n > 0 and lower TTFT."""

from __future__ import annotations

import statistics

import pytest

from gpudash.config import ProbeConfig, ServerSpec
from gpudash.launcher.probe.correlation import summarize, ttft_hit_correlation
from gpudash.telemetry.servers import ServerSource
from gpudash.launcher.probe.runner import ProbeRunner, run_probe

pytestmark = pytest.mark.llama


@pytest.fixture
def prefill_server(make_supervisor, prefill_model, llama_server):
    # One compute thread: on a busy 2-core box, multi-thread barriers make every decode wait on the
    # scheduler, which hides the prefill cost the hit/miss comparison is about.
    sup = make_supervisor([ServerSpec(name="p", model=str(prefill_model), binary=llama_server, ctx_size=4096,
                                      parallel=2, extra_args=["-t", "1"])])
    sup.start_all()
    return sup


def test_repeated_prefix_is_cached_and_faster(prefill_server) -> None:
    results = run_probe(prefill_server.base_url("p"), requests=12, concurrency=1, shared_prefix=0.5,
                        prompt_words=100, max_tokens=2, server="p")
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.prompt_tokens and r.prompt_tokens > 500 for r in results)
    hits = [r for r in results if r.cached_tokens and r.cached_tokens > 0.5 * r.prompt_tokens]
    misses = [r for r in results if r.cached_tokens is not None and r.cached_tokens < 0.1 * r.prompt_tokens]
    # Requests 1, 3, 5, ... share the prefix; the first of them fills the cache, the other five hit it.
    assert len(hits) >= 4 and len(misses) >= 6
    assert statistics.median(r.ttft_s for r in hits) < 0.7 * statistics.median(r.ttft_s for r in misses)
    assert all(r.server_prompt_ms is not None and r.server_prompt_ms > 0 for r in results)
    assert all(r.total_s >= r.ttft_s for r in results)
    corr = ttft_hit_correlation(results)
    assert corr.n == 12 and corr.pearson < -0.5 and corr.spearman < -0.5
    s = summarize(results)
    assert s.hits == len(hits) and s.hit_ttft_median_ms < s.miss_ttft_median_ms


def test_scrape_yields_llamacpp_values(prefill_server) -> None:
    source = ServerSource(prefill_server)
    try:
        before = source.poll()["servers"][0]
        assert before.state == "ready" and before.prefix_cache_hits == 0
        run_probe(prefill_server.base_url("p"), requests=4, shared_prefix=1.0, prompt_words=50, max_tokens=4)
        out = source.poll()
        (st,) = out["servers"]
        assert "errors" not in out
        assert st.server == "p" and st.kind == "llama.cpp" and st.state == "ready"
        assert st.prefix_cache_hits > 0 and st.prefix_cache_queries > st.prefix_cache_hits
        assert st.tokens_per_s > 0 and st.prompt_tokens_per_s > 0
        # llama-server no longer exports KV usage; /slots gives it (2 slots of 2048 cells, not unified)
        assert st.kv_cache_usage is not None and 0 < st.kv_cache_usage <= 1
        assert st.requests_running == 0 and st.requests_waiting == 0
        # the supervisor's own state has no tokens/s: the log's is one request's decode speed, no throughput
        assert prefill_server.states()[0].tokens_per_s is None
    finally:
        source.close()


def test_scrape_error_is_reported_not_raised(prefill_server) -> None:
    source = ServerSource(prefill_server, timeout_s=0.3)
    try:
        prefill_server.stop("p")
        (st,) = source.poll()["servers"]
        assert st.state == "stopped" and st.prefix_cache_hits is None
    finally:
        source.close()


def test_probe_runner_pushes_requests(prefill_server, events) -> None:
    runner = ProbeRunner(prefill_server, ProbeConfig(interval_s=0.05, concurrency=2, prompt_tokens=20,
                                                      max_tokens=2, shared_prefix=0.5), events.inbox)
    runner.start()
    got = []
    try:
        import time

        deadline = time.monotonic() + 20
        while len(got) < 6 and time.monotonic() < deadline:
            got.extend(events.inbox.poll()["requests"])
            time.sleep(0.05)
    finally:
        runner.stop()
    assert len(got) >= 6
    assert all(r.server == "p" and r.ok and r.ttft_s > 0 for r in got)
    assert any(r.cached_tokens for r in got)


def test_draft_model_acceptance_from_metrics_and_log(make_supervisor, tiny_model, llama_server) -> None:
    # The model drafts for itself: with greedy sampling nearly every drafted token is accepted. This build's
    # help says --draft-max was renamed; the launcher must pass what the binary understands.
    import httpx

    sup = make_supervisor([ServerSpec(name="d", model=str(tiny_model), binary=llama_server, ctx_size=1024,
                                      parallel=1, draft_model=str(tiny_model), draft_max=4, draft_min=1)])
    sup.start_all()
    body = {"messages": [{"role": "user", "content": "count with me"}], "max_tokens": 48, "temperature": 0}
    source = ServerSource(sup)
    try:
        (idle,) = source.poll()["servers"]  # acceptance is per scrape interval: this one drafted nothing
        for _ in range(2):
            assert httpx.post(f"{sup.base_url('d')}/v1/chat/completions", json=body, timeout=60,
                              trust_env=False).status_code == 200
        (st,) = source.poll()["servers"]
    finally:
        source.close()
    assert idle.draft_acceptance is None
    assert st.draft_acceptance is not None and st.draft_acceptance > 0.5
    logged = sup.states()[0].draft_acceptance
    assert logged is not None and logged > 0.5
    header = sup.log_path("d").read_text().splitlines()[0]
    assert "-md" in header and ("--draft-max 4" in header or "--spec-draft-n-max 4" in header)
