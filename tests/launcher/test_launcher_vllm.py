"""Kind `vllm` end to end against the vLLM test double (tests/doubles/vllm_double.py), run as `vllm` on PATH.

The double is a real HTTP server process that refuses connections until "loaded" and serves vLLM's
documented endpoints and metric names; it is not vLLM (no model runs, no GPU is used).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from vllm_double import CHAT_TEMPLATE_TOKENS
from gpudash.config import ServerSpec
from gpudash.launcher.binary import resolve_binary
from gpudash.launcher.errors import LaunchError
from gpudash.telemetry import servers as metrics
from gpudash.telemetry.servers import ServerSource
from gpudash.launcher.probe.runner import run_probe


def vspec(name: str = "v", **kw) -> ServerSpec:
    return ServerSpec(name=name, kind="vllm", model="Qwen/Qwen3-0.6B", **kw)


def test_vllm_start_scrape_probe(fake_vllm, make_supervisor, events) -> None:
    sup = make_supervisor([vspec(share=0.3, enable_prefix_caching=True, extra_args=["--load-delay", "0.8"])])
    assert resolve_binary(sup.specs()["v"]) == str(fake_vllm)
    t0 = time.monotonic()
    sup.start_all()
    assert time.monotonic() - t0 >= 0.8  # waited through the refused connections of "loading"
    assert [e.kind for e in events.drain()] == ["server.start", "server.ready"]
    log = sup.log_path("v").read_text()
    assert "serve Qwen/Qwen3-0.6B --host 127.0.0.1 --port" in log
    assert "--gpu-memory-utilization 0.3" in log and "--enable-prefix-caching" in log
    assert "gpu_memory_utilization=0.3" in log  # the double parsed what the launcher passed

    results = run_probe(sup.base_url("v") + "/v1/", requests=8, shared_prefix=1.0, prompt_words=64, max_tokens=3, server="v")
    assert all(r.ok for r in results), [r.error for r in results]
    assert results[0].cached_tokens == 0 and all(r.cached_tokens >= 48 for r in results[1:])
    # one token per word plus the double's chat template's own
    assert all(r.prompt_tokens == 64 + CHAT_TEMPLATE_TOKENS and r.completion_tokens == 3 for r in results)
    assert all(r.server_prompt_ms is None for r in results)  # vLLM reports no per-request timings

    source = ServerSource(sup)
    try:
        (first,) = source.poll()["servers"]
        run_probe(sup.base_url("v"), requests=3, shared_prefix=1.0, prompt_words=64, max_tokens=3)
        (st,) = source.poll()["servers"]
    finally:
        source.close()
    assert st.kind == "vllm" and st.state == "ready"
    assert st.prefix_cache_queries == first.prefix_cache_queries + 3 * (64 + CHAT_TEMPLATE_TOKENS)
    assert st.prefix_cache_hits > first.prefix_cache_hits
    assert st.requests_running == 0 and st.requests_waiting == 0 and 0 <= st.kv_cache_usage <= 1
    assert st.ttft_mean_s is not None and st.ttft_mean_s > 0  # from the histogram's change since last scrape
    assert st.tokens_per_s > 0


def test_a_slow_look_for_servers_never_holds_a_scrape(fake_vllm, make_supervisor, monkeypatch) -> None:
    monkeypatch.setattr(metrics, "SCRAPE_WORKERS", 1)  # one scrape worker: a look for servers on it would hold it
    sup = make_supervisor([vspec(extra_args=["--load-delay", "0"])])
    sup.start_all()
    release = threading.Event()

    def gpu_pids() -> list[tuple[int, int]]:  # NVML's process list, answering only when released
        release.wait(60)
        return []

    source = ServerSource(sup, gpu_pids=gpu_pids)
    try:
        source.poll()  # starts the look for servers, which now waits
        t0 = time.monotonic()
        (st,) = source.poll()["servers"]
        took = time.monotonic() - t0
    finally:
        release.set()
        source.close()
    assert st.state == "ready" and st.kv_cache_usage is not None  # scraped
    assert took < 10, f"the tick waited {took:.1f} s for the look for servers"


def test_vllm_enforce_eager_when_three_share_a_gpu(fake_vllm, make_supervisor) -> None:
    specs = [vspec(n, gpus=[0], share=0.3, extra_args=["--load-delay", "0"]) for n in ("a", "b", "c")]
    sup = make_supervisor(specs)
    sup.start_all()
    for n in ("a", "b", "c"):
        assert "enforce_eager=True" in sup.log_path(n).read_text()
        assert httpx.get(f"{sup.base_url(n)}/health", trust_env=False).status_code == 200


def test_vllm_missing(make_supervisor, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    sup = make_supervisor([vspec()])
    with pytest.raises(LaunchError, match=r"server 'v': vLLM's `vllm` command is not on PATH"):
        sup.start_all()


def test_vllm_local_model_path_checked(fake_vllm, make_supervisor) -> None:
    sup = make_supervisor([ServerSpec(name="v", kind="vllm", model="/models/missing-dir")])
    with pytest.raises(LaunchError, match=r"server 'v': model file '/models/missing-dir' does not exist"):
        sup.start_all()


def test_vllm_restart_with_new_share(fake_vllm, make_supervisor, events) -> None:
    sup = make_supervisor([vspec(share=0.3, extra_args=["--load-delay", "0"])])
    sup.start_all()
    port = sup.states()[0].port
    sup.restart("v", sup.specs()["v"].model_copy(update={"share": 0.5}))
    assert sup.log_path("v").read_text().count("gpu_memory_utilization=0.5") == 1
    assert sup.states()[0].port == port and sup.states()[0].state == "ready"
    restart = [e for e in events.drain() if e.kind == "server.restart"][-1]
    assert (restart.old["share"], restart.new["share"]) == (0.3, 0.5)


def test_double_completions_endpoint(fake_vllm, make_supervisor) -> None:
    sup = make_supervisor([vspec(extra_args=["--load-delay", "0"])])
    sup.start_all()
    base = sup.base_url("v")
    with httpx.Client(trust_env=False, timeout=10) as c:
        r = c.post(f"{base}/v1/completions", json={"model": "Qwen/Qwen3-0.6B", "prompt": "a b c", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 3
        assert r.json()["choices"][0]["text"]
        lines = []
        with c.stream("POST", f"{base}/v1/completions", json={"model": "Qwen/Qwen3-0.6B", "prompt": "a b c",
                                                              "max_tokens": 2, "stream": True}) as s:
            lines = [ln for ln in s.iter_lines() if ln.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and len(lines) == 3  # two tokens, no usage chunk unless asked
        wrong = c.post(f"{base}/v1/chat/completions", json={"model": "other", "messages": []})
        assert wrong.status_code == 404 and "does not exist" in wrong.json()["error"]["message"]  # ErrorResponse


def test_vllm_data_parallel_engines_are_combined(fake_vllm, make_supervisor) -> None:
    import httpx

    sup = make_supervisor([vspec(extra_args=["--load-delay", "0", "-dp", "2"])])
    sup.start_all()
    text = httpx.get(sup.base_url("v") + "/metrics", trust_env=False).text
    assert 'engine="0"' in text and 'engine="1"' in text
    source = ServerSource(sup)
    try:
        source.poll()
        run_probe(sup.base_url("v"), requests=4, shared_prefix=1.0, prompt_words=64, max_tokens=2)
        (st,) = source.poll()["servers"]
    finally:
        source.close()
    # counters of both engines added up (each prompt: 64 words and the chat template's tokens)
    assert st.prefix_cache_queries == 4 * (64 + CHAT_TEMPLATE_TOKENS)
    engines = [float(line.rsplit(" ", 1)[1]) for line in httpx.get(sup.base_url("v") + "/metrics",
                                                                      trust_env=False).text.splitlines()
               if line.startswith("vllm:kv_cache_usage_perc{")]
    # the fullest engine (the one that preempts first), not their sum; each engine's own beside it
    assert len(engines) == 2 and st.kv_cache_usage == pytest.approx(max(engines))
    assert st.kv_cache_usage_engines == pytest.approx(tuple(engines))
    assert st.prompt_tokens_per_s is not None and st.prompt_tokens_per_s > 0
