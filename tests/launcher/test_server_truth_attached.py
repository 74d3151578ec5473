"""Issue 34: an attached llama-server's figures as the server lived them, each compared with the server's own
answer (its /slots, its completion `timings`, its counters) within 10%: KV use with `-np 4` and with the
default unified buffer, prompt tokens/s while a long prefill runs, tokens/s with `--no-slots` (prefill
time: test_prefill_truth.py), and a kill and restart on the same port (seen back within 2 s, its outage in events and
rows of their own time, the new pid after); and the vLLM double's figures operators page on, 0.34 and 0.33."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.config import ServerSpec
from gpudash.launcher.health import free_port, wait_healthy
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.supervisor import Supervisor
from gpudash.records import ServerState
from gpudash.telemetry.servers import ServerSource
from launcher_helpers import started_outside
from test_attach import DOUBLE, read_until


# Slow enough on one CPU thread that a prefill of ~2500 tokens takes seconds (batches of 256 show progress).
SLOW = DemoModelShape(layers=8, embedding=512, heads=8, heads_kv=8, feed_forward=1024, context=8192)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("models") / "slow.gguf", SLOW)


class Outside:
    """A llama-server the test starts and kills itself (its own session), on a port that stays the same."""

    def __init__(self, binary: str, model: Path, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "--metrics",
                     "-t", "1", *flags]
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        wait_healthy(self.proc, f"{self.url}/health", 60.0)
        return self.proc

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def outside(binary: str, model: Path, *flags: str) -> Iterator[Outside]:
    srv = Outside(binary, model, *flags)
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()


def attached(url: str, tmp_path: Path, events) -> tuple[Supervisor, ServerSource]:
    sup = Supervisor([ServerSpec(name="ext", url=url)], events.inbox, tmp_path / "logs")
    return sup, ServerSource(sup)


def complete(url: str, prompt: str, n: int, **extra) -> dict:
    r = httpx.post(f"{url}/completion", json={"prompt": prompt, "n_predict": n, **extra}, timeout=300, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


def slots_truth(url: str, unified: bool) -> float:
    """KV use as the server's own /slots says it: tokens held over the cells there are."""
    slots = httpx.get(f"{url}/slots", trust_env=False).json()
    held = sum(s.get("n_prompt_tokens", 0) for s in slots)
    return held / (max(s["n_ctx"] for s in slots) if unified else sum(s["n_ctx"] for s in slots))


@pytest.mark.llama
@pytest.mark.parametrize("flags, unified", [(("-c", "4096", "-np", "4"), False), (("-c", "4096"), True)])
def test_kv_use_of_an_attached_server_is_what_its_slots_hold(llama_server, prefill_model, events, tmp_path,
                                                             flags, unified) -> None:
    """Four streams of ~600 tokens: with -np 4 each slot owns 1024 cells (0.6 of them full, not 1.00);
    with the default unified buffer they share 4096."""
    for srv in outside(llama_server, prefill_model, *flags):
        words = "time person year way day thing man world life hand".split()
        prompts = [" ".join(words[i:] + words[:i]) * 8 for i in range(4)]  # ~600 tokens of the demo vocabulary
        streams = [threading.Thread(target=complete, args=(srv.url, p, 8), kwargs={"id_slot": i})
                   for i, p in enumerate(prompts)]
        for t in streams:
            t.start()
        for t in streams:
            t.join()
        sup, source = attached(srv.url, tmp_path, events)
        try:
            st = read_until(source, "ext", lambda s: s.state == "ready" and s.kv_cache_usage is not None)
        finally:
            source.close()
        truth = slots_truth(srv.url, unified)
        assert 0.1 < truth < 0.95
        assert st.kv_cache_usage == pytest.approx(truth, rel=0.10)
        assert st.kv_capacity_tokens == 4096
        assert [s[1] for s in st.slot_states] == ["idle"] * 4 and all(s[2] > 500 for s in st.slot_states)


@pytest.mark.llama
def test_prompt_tokens_per_s_shows_while_a_long_prefill_runs(llama_server, slow_model, events, tmp_path) -> None:
    """One prompt of ~2500 tokens evaluated in batches of 256 over seconds: llama-server's counter moves only
    at its end (one step), the rate from /slots' progress shows during it, and over its window it is prompt_n."""
    for srv in outside(llama_server, slow_model, "-c", "8192", "-np", "1", "-b", "256", "-ub", "256"):
        sup, source = attached(srv.url, tmp_path, events)
        answer: dict = {}
        try:
            base = read_until(source, "ext", lambda s: s.state == "ready")
            ticks = [(base.ts, None)]
            worker = threading.Thread(target=lambda: answer.update(
                complete(srv.url, " ".join(["time person year way day thing"] * 60), 1), t_end=time.time()))
            t_start = time.time()
            worker.start()
            while worker.is_alive():
                time.sleep(0.25)
                (st,) = [s for s in source.poll()["servers"] if s.server == "ext"]
                ticks.append((st.ts, st.prompt_tokens_per_s))
            time.sleep(0.6)
            after = read_until(source, "ext", lambda s: s.ts > answer["t_end"] + 0.5)
        finally:
            source.close()
        prompt_n = answer["timings"]["prompt_n"]
        assert prompt_n > 2000 and answer["timings"]["prompt_ms"] > 1500, answer["timings"]
        during = [r for ts, r in ticks if t_start + 0.5 < ts <= answer["t_end"] - 0.3]
        assert len(during) >= 3 and sum(1 for r in during if r) >= 0.5 * len(during), ticks
        # the rate covers the last rate_window_s: read once the prefill is over, its window holds all of it
        assert after.ts - after.rate_window_s <= t_start, (after.ts - t_start, after.rate_window_s)
        assert after.prompt_tokens_per_s * after.rate_window_s == pytest.approx(prompt_n, rel=0.10), ticks


@pytest.mark.llama
def test_no_slots_falls_back_to_the_counters(llama_server, prefill_model, events, tmp_path) -> None:
    """`--no-slots`: /slots answers 501; generated tokens/s comes from tokens_predicted_total, marked coarse."""
    for srv in outside(llama_server, prefill_model, "-c", "2048", "-np", "1", "--no-slots"):
        assert httpx.get(f"{srv.url}/slots", trust_env=False).status_code == 501
        sup, source = attached(srv.url, tmp_path, events)
        try:
            base = read_until(source, "ext", lambda s: s.state == "ready")
            t0 = time.time()
            got = complete(srv.url, "Once upon a time", 300, ignore_eos=True)
            st = read_until(source, "ext", lambda s: (s.tokens_per_s or 0) > 0)
        finally:
            source.close()
        assert st.rates_coarse is True and base.kv_cache_usage is None
        # the rate covers the interval since the last read: rate * interval is the request's tokens
        assert got["timings"]["predicted_n"] == 300 and st.tokens_per_s * (st.ts - max(t0, base.ts)) > 0


@pytest.mark.llama
def test_a_server_killed_and_restarted_on_its_port(llama_server, prefill_model, events, tmp_path) -> None:
    for srv in outside(llama_server, prefill_model, "-c", "1024", "-np", "1"):
        first_pid = srv.proc.pid
        sup, source = attached(srv.url, tmp_path, events)
        try:
            up = read_until(source, "ext", lambda s: s.state == "ready")
            assert up.pid == first_pid
            srv.kill()
            down = read_until(source, "ext", lambda s: s.state == ServerState.UNREACHABLE)
            rows = []
            for _ in range(5):  # the outage's rows: each with its own time
                time.sleep(0.2)
                rows += [s for s in source.poll()["servers"] if s.server == "ext"]
            assert len({r.ts for r in rows}) == len(rows) and all(r.state == ServerState.UNREACHABLE for r in rows)
            time.sleep(3.0)  # a longer outage: a backoff would now wait several seconds
            srv.start()
            answered = time.monotonic()
            back = read_until(source, "ext", lambda s: s.state == "ready")
            seen_after = time.monotonic() - answered
        finally:
            source.close()
        assert seen_after < 2.0, f"ready {seen_after:.1f} s after the server answered"
        assert back.pid == srv.proc.pid != first_pid
        got = events.drain()
        kinds = [(e.kind, e.target) for e in got if e.kind in ("server.down", "server.up")]
        assert kinds == [("server.down", "ext"), ("server.up", "ext")]
        assert down.error and "unreachable" in down.error
        up_event = [e for e in got if e.kind == "server.up"][0]
        assert f"as pid {srv.proc.pid}" in up_event.reason


def _double(*flags: str) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    for _ in started_outside([sys.executable, str(DOUBLE), "serve", "org/model", "--host", "127.0.0.1", "--port",
                              str(port), "--load-delay", "0", *flags], url):
        yield url


def _own(url: str) -> dict[str, float]:
    """The double's own /metrics, summed over engines per sample name and label set that matters here."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", trust_env=False).text):
        for s in fam.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items())
                                   if k in ("finished_reason", "reason"))
            out[key] = out.get(key, 0.0) + s.value
            if key != s.name:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _load(url: str, n: int, abort: int) -> None:
    """`n` streamed chats at once (the double runs one at a time: the rest queue), `abort` of them closed by
    the client after the first chunk."""
    def one(i: int) -> None:
        body = {"model": "org/model", "messages": [{"role": "user", "content": f"q{i} " + "w " * 300}],
                "max_tokens": 40, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60, trust_env=False) as r:
                for k, _ in enumerate(r.iter_lines()):
                    if i < abort and k >= 1:
                        return
        except httpx.HTTPError:
            pass

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("release", ["0.34", "0.33"])
def test_vllm_figures_operators_page_on_match_the_servers_own(events, tmp_path, release) -> None:
    """The vLLM double (0.34 families; 0.33 with --release 0.33), two DP engines, two requests running at
    a time, a queue limit of 5 and 30 GPU blocks: queued, preempted, aborted and refused requests; every
    figure against the double's own /metrics within 10%."""
    flags = ["-dp", "2", "--max-num-seqs", "2", "--max-num-queued-reqs", "5", "--num-gpu-blocks-override", "30",
             "--release", release]
    for url in _double(*flags):
        sup, source = attached(url, tmp_path, events)
        try:
            read_until(source, "ext", lambda s: s.state == "ready")
            before = _own(url)
            _load(url, 8, abort=2)
            after = _own(url)
            st = read_until(source, "ext", lambda s: (s.requests_finished or 0) >= after["vllm:request_success_total"])
            later = []  # the server's own TTFT quantiles stay for the window, not one tick
            for _ in range(8):
                time.sleep(0.25)
                later += [s for s in source.poll()["servers"] if s.server == "ext"]
        finally:
            source.close()

        def grew(key: str) -> float:
            return after.get(key, 0.0) - before.get(key, 0.0)

        assert grew("vllm:admission_rejections_total") == (3 if release == "0.34" else 0)
        assert st.requests_rejected == (after["vllm:admission_rejections_total"] if release == "0.34" else None)
        assert grew("vllm:request_success_total|finished_reason=abort") >= 1
        assert st.requests_aborted == after["vllm:request_success_total|finished_reason=abort"]
        assert st.requests_finished == after["vllm:request_success_total"]
        assert st.preemptions == after["vllm:num_preemptions_total"] and grew("vllm:num_preemptions_total") >= 1
        assert st.kv_capacity_tokens == 2 * 30 * 16
        for field, family in (("queue_mean_s", "vllm:request_queue_time_seconds"),
                              ("itl_mean_s", "vllm:inter_token_latency_seconds"),
                              ("e2e_mean_s", "vllm:e2e_request_latency_seconds"),
                              ("ttft_mean_s", "vllm:time_to_first_token_seconds")):
            truth = grew(f"{family}_sum") / grew(f"{family}_count")
            assert getattr(st, field) == pytest.approx(truth, rel=0.10), field
        assert st.queue_p99_s is not None and st.queue_p99_s >= st.queue_mean_s * 0.5
        assert all(s.ttft_p90_s is not None for s in later), [s.ttft_p90_s for s in later]
        assert st.ttft_count == after["vllm:time_to_first_token_seconds_count"]
        assert st.ttft_buckets[-1] == ("+Inf", st.ttft_count)
