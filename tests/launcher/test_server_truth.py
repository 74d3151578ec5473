"""Server figures equal what the server did: generated tokens/s from a real llama-server during one long
generation (the counter plus what busy slots decoded so far, over wall-clock time), acceptance from
%g-printed counters, TTFT quantiles from a histogram's bucket deltas, vLLM's own hit sources and prompt
rates across releases, and probe failures that are counted and told once per distinct error."""

from __future__ import annotations

import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from gpudash.config import ProbeConfig, ServerSpec
from gpudash.launcher.probe.correlation import summarize
from gpudash.launcher.counters import Prev, acceptance, parse_metrics, printed_step, quantiles
from gpudash.launcher.kinds import KINDS
from gpudash.launcher.kinds.vllm import vllm_fields
from gpudash.telemetry.servers import ServerSource
from gpudash.launcher.probe.runner import ProbeRunner
from gpudash.records import ServerSample
from gpudash.telemetry.inbox import Inbox
from launcher_helpers import OneServer, QuietHandler

SAMPLES = Path(__file__).parent / "samples"


@pytest.mark.llama
def test_tokens_per_s_during_a_long_generation_integrates_to_the_tokens_generated(
        make_supervisor, prefill_model, llama_server) -> None:
    """One generation of 3500 tokens (seconds on one CPU thread) watched every 0.25 s, as the recorder would:
    the figure is there while the request runs (llama-server's own counter moves only when it ends), and over
    its window it is what was generated."""
    sup = make_supervisor([ServerSpec(name="g", model=str(prefill_model), binary=llama_server, ctx_size=4096,
                                      parallel=1, health_timeout_s=60, extra_args=["-t", "1"])])
    sup.start_all()
    url = sup.base_url("g")
    answer: dict = {}

    def generate() -> None:
        r = httpx.post(f"{url}/completion", json={"prompt": "Once upon a time", "n_predict": 3500,
                                                  "ignore_eos": True, "temperature": 1.0}, timeout=300, trust_env=False)
        answer.update(r.json(), t_end=time.time())

    source = ServerSource(sup)
    ticks: list[ServerSample] = []
    try:
        (base,) = source.poll()["servers"]  # the first read: the baseline the rates are measured against
        ticks.append(base)
        worker = threading.Thread(target=generate)
        t_start = time.time()
        worker.start()
        while worker.is_alive():
            time.sleep(0.25)
            (st,) = source.poll()["servers"]
            ticks.append(st)
        time.sleep(0.25)
        (after,) = source.poll()["servers"]
    finally:
        source.close()
    generated = answer["timings"]["predicted_n"]
    assert generated == 3500
    during = [s.tokens_per_s for s in ticks if t_start < s.ts <= answer["t_end"]]
    assert len(during) >= 4, f"the generation took {answer['t_end'] - t_start:.1f} s: too short to watch"
    assert sum(1 for r in during if r) >= 0.8 * len(during), during  # not only when the request ends
    assert windowed_total(ticks + [after], t_start) == pytest.approx(generated, rel=0.10), during


def windowed_total(ticks: list[ServerSample], t_start: float) -> float:
    """Tokens over the reads' windows laid end to end, back from the last read to one before `t_start`: each
    rate covers its rate_window_s, which starts at an earlier read."""
    at = {round(s.ts, 3): s for s in ticks}
    cur, total = ticks[-1], 0.0
    while True:
        assert cur.tokens_per_s is not None and cur.rate_window_s is not None, cur
        total += cur.tokens_per_s * cur.rate_window_s
        start = cur.ts - cur.rate_window_s
        if start <= t_start:
            return total
        cur = at[round(start, 3)]


def test_printed_step_of_a_g_formatted_counter() -> None:
    assert [printed_step(v) for v in (999_999, 1_000_000, 12_345_600, 123_456_000)] == [0.0, 10.0, 100.0, 1000.0]


def test_acceptance_from_rounded_counters_widens_the_interval_instead_of_passing_one() -> None:
    """llama-server prints counters with %g (6 significant digits). Drafted 12,345,600 -> 12,345,670 (70 more)
    and accepted 10,000,000 -> 10,000,060 (60 more: truth 0.857) print as 1.23456e+07 -> 1.23457e+07 and
    1e+07 -> 1e+07 + 100: a ratio of 1.0 or 2.0 from noise. Those deltas are under 100 steps: no figure yet,
    the start is kept, and once the drafted delta spans enough steps the ratio is the truth within 1%."""
    d, a = "llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total"
    start = {d: 12_345_600.0, a: 10_000_000.0}
    m1 = {d: 12_345_700.0, a: 10_000_100.0}  # what %g shows after 70 drafted, 60 accepted
    assert m1[a] - start[a] == 100 and (m1[a] - start[a]) / (m1[d] - start[d]) == 1.0  # the naive ratio is wrong
    assert acceptance(m1, Prev(1, 0.0, start), 1, d, a) is None
    assert (m1[f"{d}@start"], m1[f"{a}@start"]) == (start[d], start[a])  # the interval widens from here
    true_d, true_a = 70_000, 60_000  # later: 70,000 more drafted, 60,000 more accepted (0.857)
    m2 = {d: float(f"{12_345_670 + true_d:g}"), a: float(f"{10_000_060 + true_a:g}")}
    got = acceptance(m2, Prev(1, 1.0, m1), 1, d, a)
    assert got is not None and 0.0 <= got <= 1.0 and got == pytest.approx(6 / 7, rel=0.01)
    assert f"{d}@start" not in m2  # measured: the next interval starts here
    small = {d: 500.0, a: 400.0}  # below 10**6 the counters are exact: every interval counts
    assert acceptance({d: 510.0, a: 409.0}, Prev(1, 0.0, small), 1, d, a) == pytest.approx(0.9)


def test_ttft_quantiles_from_the_histograms_bucket_deltas() -> None:
    text = "\n".join(["# TYPE vllm:time_to_first_token_seconds histogram"] + [
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {n}'
        for le, n in (("0.1", 10), ("0.5", 20), ("1.0", 30), ("+Inf", 30))] + [
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 30',
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 9.0', ""])
    before = parse_metrics(text)
    after = dict(before)
    # 100 new requests: 50 under 0.1 s, 40 in (0.1, 0.5], 10 in (0.5, 1.0]
    for le, more in (("0.1", 50), ("0.5", 90), ("1.0", 100), ("+Inf", 100)):
        after[f'vllm:time_to_first_token_seconds_bucket{{le="{le}"}}'] += more
    q = quantiles(after, Prev(1, 0.0, before), 1, "vllm:time_to_first_token_seconds")
    assert q == pytest.approx({0.5: 0.1, 0.9: 0.5, 0.99: 0.95})
    assert quantiles(before, Prev(1, 0.0, before), 1, "vllm:time_to_first_token_seconds") is None  # none new
    assert quantiles(after, Prev(2, 0.0, before), 1, "vllm:time_to_first_token_seconds") is None  # restarted


def test_vllm_sample_quantiles_and_hit_sources() -> None:
    a = parse_metrics((SAMPLES / "vllm-0.33.0-metrics-dp2-a.txt").read_text())
    b = parse_metrics((SAMPLES / "vllm-0.33.0-metrics-dp2-b.txt").read_text())
    f = vllm_fields(b, Prev(1, 100.0, a), 1, 110.0)
    assert f["ttft_p50_s"] is not None and f["ttft_p50_s"] <= f["ttft_p90_s"] <= f["ttft_p99_s"]
    ext = dict(b, **{"vllm:external_prefix_cache_queries_total": 800.0, "vllm:external_prefix_cache_hits_total": 300.0})
    g = vllm_fields(ext, Prev(1, 100.0, a), 1, 110.0)
    assert (g["external_prefix_cache_queries"], g["external_prefix_cache_hits"]) == (800.0, 300.0)
    assert f["external_prefix_cache_queries"] is None  # not offloading: unknown, never 0


def test_vllm_0_10_computed_prompt_rate_leaves_out_prefix_cache_hits() -> None:
    """vLLM 0.9-0.10 (V1 engine, vllm/v1/metrics/loggers.py of those releases) exported the whole prompt
    (vllm:prompt_tokens_total) and prefix-cache hits in tokens (vllm:prefix_cache_hits_total), but neither
    vllm:prompt_tokens_by_source nor vllm:prompt_tokens_cached: computed = whole - hits."""
    m0 = {"vllm:prompt_tokens_total": 1000.0, "vllm:prefix_cache_queries_total": 1000.0,
          "vllm:prefix_cache_hits_total": 400.0}
    m1 = {"vllm:prompt_tokens_total": 3000.0, "vllm:prefix_cache_queries_total": 3000.0,
          "vllm:prefix_cache_hits_total": 1600.0}
    assert vllm_fields(m1, Prev(1, 0.0, m0), 1, 2.0)["prompt_tokens_per_s"] == pytest.approx((2000 - 1200) / 2)


class _Refuses(QuietHandler):
    """Lists a model, then answers every chat completion with HTTP 400 (as a server with a bad template)."""

    def do_GET(self) -> None:
        self.reply(200, b'{"data": [{"id": "m"}]}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(400, b'{"error": "the chat template failed"}')



def test_failed_probe_requests_are_counted_and_each_distinct_error_is_one_event() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    inbox = Inbox()
    runner = ProbeRunner(OneServer(f"http://127.0.0.1:{server.server_address[1]}"),
                         ProbeConfig(interval_s=0.05, concurrency=3, prompt_tokens=8, max_tokens=2), inbox)
    try:
        runner.start()
        requests: list = []
        events: list = []
        deadline = time.monotonic() + 20
        while len(requests) < 12 and time.monotonic() < deadline:
            got = inbox.poll()
            requests += got["requests"]
            events += got["events"]
            time.sleep(0.05)
    finally:
        runner.stop()
        server.shutdown()
        server.server_close()
    assert len(requests) >= 12 and not any(r.ok for r in requests)
    summary = summarize(requests)
    assert summary.failed == len(requests) and summary.ttft_median_ms is None
    assert summary.last_error == 'HTTP 400: the chat template failed'  # the server's message, one line
    assert [(e.kind, e.reason) for e in events] == [("probe.error", summary.last_error)]  # one, not one each


def test_vllm_sleep_level_0_is_valid() -> None:
    vllm = KINDS["vllm"]
    spec = ServerSpec(name="v", kind="vllm", model="m", enable_sleep_mode=True)
    assert vllm.sleep_problem(spec, 0) is None and vllm.sleep_problem(spec, 2) is None
    assert "sleep level 3 is not 0 (scheduling paused)" in vllm.sleep_problem(spec, 3)
    assert "enable_sleep_mode = true" in vllm.sleep_problem(ServerSpec(name="v", kind="vllm", model="m"), 0)
    assert "llama-server has no sleep mode" == KINDS["llama.cpp"].sleep_problem(ServerSpec(name="l", model="m"))


def test_prometheus_shows_failed_probe_requests_server_quantiles_and_attached_servers() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gpudash.config import PrometheusConfig
    from gpudash.records import RequestSample, Snapshot
    from gpudash.telemetry.prometheus import PrometheusSink

    failed = [RequestSample(ts=1.0, server="ext", ttft_s=None, total_s=0.1, prompt_tokens=None, cached_tokens=None,
                            ok=False, error="HTTP 400: bad template") for _ in range(3)]
    st = ServerSample(ts=1.0, server="ext", kind="vllm", state="ready", origin="attached", ttft_p50_s=0.1,
                      ttft_p90_s=0.5, ttft_p99_s=0.9, external_prefix_cache_queries=80.0,
                      external_prefix_cache_hits=30.0)
    sink = PrometheusSink("127.0.0.1", 0, settings=PrometheusConfig(gpu="all", servers="all"))
    try:
        sink(Snapshot(1.0, 0, "sim:h200", servers=(st,), requests=tuple(failed)))
        text = httpx.get(f"http://127.0.0.1:{sink._server.server_address[1]}/metrics", trust_env=False).text
    finally:
        sink.close()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (n,) = [s for s in fams["gpudash_server_probe_failed_requests"].samples if s.name.endswith("_total")]
    assert n.value == 3 and n.labels["server"] == "ext"
    (info,) = fams["gpudash_server_probe_last_error_info"].samples
    assert info.labels["error"] == "HTTP 400: bad template"
    assert "gpudash_server_ttft_p90_seconds" not in fams  # a TTFT is exported as a histogram only
    hits = [s for s in fams["gpudash_server_external_prefix_cache_hits"].samples if s.name.endswith("_total")]
    assert hits[0].value == 30.0
