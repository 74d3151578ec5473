"""A test double of `vllm serve`: a real HTTP server process reproducing vLLM 0.34's surface (0.33's with
`--release 0.33`).

It is not vLLM: no model runs. It exists so the launcher's vLLM path (argv, health gating, /metrics,
streaming usage with cached tokens, sleep mode) is exercised against a real process on 127.0.0.1 in CI,
where vLLM and GPUs are absent. What it reproduces (from vLLM 0.33.0's sources; the samples in
tests/launcher/samples, made from those sources, pin the details):

* the command line `vllm serve MODEL --host H --port P [...flags]` and `vllm serve --help=all`, whose
  boolean flags read like vLLM's (vllm/utils/argparse_utils.py EnableDisableAction):
  `--enable-prefix-caching, --disable-prefix-caching` with the `--no-enable-...` form hidden but accepted,
  `--enforce-eager, --no-enforce-eager`; plus -tp, -pp, -dp, --max-model-len, --max-num-seqs,
  --kv-offloading-size/--kv-offloading-backend and --gpu-memory-utilization;
* refusing connections until "loaded" (the socket is bound only after `--load-delay` seconds);
* GET /health (200), GET /v1/models, POST /v1/completions and /v1/chat/completions, streaming (SSE with
  `data: [DONE]`) or not, with `usage` and, with --enable-prompt-tokens-details,
  `usage.prompt_tokens_details.cached_tokens`;
* automatic prefix caching in blocks of 16 tokens (one token = one whitespace-separated word), with
  prompt processing time proportional to the uncached tokens, so hits have lower TTFT;
* a GPU prefix cache of `--num-gpu-blocks-override` blocks at most (least recently used evicted) and, with
  `--kv-offloading-size`, a host-memory copy of every block (the native CPU offload): a prompt's blocks
  after its GPU hits are looked up there, counted as vllm:external_prefix_cache_queries / _hits and as
  vllm:prompt_tokens_by_source{source="external_kv_transfer"} (names and help texts as vLLM 0.33's
  loggers.py writes them);
* GET /metrics with the families of vllm/v1/metrics/loggers.py that gpudash reads, one series per
  data-parallel engine (labels model_name, engine; requests go round-robin over the engines):
  vllm:num_requests_running / waiting, vllm:engine_sleep_state{sleep_state}, vllm:kv_cache_usage_perc,
  vllm:prefix_cache_queries / hits, vllm:prompt_tokens, vllm:prompt_tokens_by_source{source},
  vllm:prompt_tokens_cached, vllm:generation_tokens and vllm:time_to_first_token_seconds;
* with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/dev/sleep/api_router.py): POST /sleep?level=1|2,
  POST /wake_up, GET /is_sleeping; sleeping needs --enable-sleep-mode, takes `--sleep-delay` seconds and
  waking `--wake-delay` seconds;
* what operators page on, as vLLM 0.34.0's vllm/v1/metrics/loggers.py names, labels and buckets them
  (vllm/v1/metrics/buckets.py): vllm:num_preemptions, vllm:request_success{finished_reason=stop|length|
  abort|error|repetition}, vllm:num_requests_waiting_by_reason{reason=capacity|deferred},
  vllm:inter_token_latency_seconds, vllm:request_time_per_output_token_seconds,
  vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds,
  vllm:request_decode_time_seconds, vllm:cache_config_info (block_size, num_gpu_blocks,
  kv_cache_size_tokens, engine), vllm:admission_rejections{model_name,reason} (`--max-num-queued-reqs`:
  a request past it is refused with HTTP 503, vllm/v1/engine/async_llm.py), vllm:corrupted_requests (only
  with VLLM_COMPUTE_NANS_IN_LOGITS=1) and, with --kv-cache-metrics, vllm:kv_block_lifetime_seconds.
  `--release 0.33` leaves out what 0.34 added (admission_rejections, corrupted_requests,
  request_decode_time_seconds, request_time_per_output_token_seconds, the KV block histograms);
* scheduling: at most `--max-num-seqs` requests run at once, the rest wait (queue time, waiting by
  reason "capacity"); a request that starts while the running ones hold more than the GPU blocks
  preempts one (vllm:num_preemptions); a client that goes away mid-stream is an abort;
* POST /tokenize (vllm/entrypoints/serve/tokenize/protocol.py): {"prompt"} or {"messages"} ->
  {"count", "max_model_len", "tokens"}; a chat's template adds CHAT_TEMPLATE_TOKENS per message;
* a prompt longer than --max-model-len is refused with HTTP 400 and vLLM's ErrorResponse
  ({"error": {"message", "type", "param", "code"}}, vllm/entrypoints/serve/engine/protocol.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BLOCK = 16
PREFILL_S_PER_TOKEN = 0.0004
DECODE_S_PER_TOKEN = 0.001
DEFAULT_GPU_BLOCKS = 6250  # 100 000 tokens of KV cache
CHAT_TEMPLATE_TOKENS = 4  # what the double's chat template adds per message
# vllm/v1/metrics/buckets.py of 0.34.0
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
RESIDENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600,
                     1200, 1800)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vllm/v1/engine/__init__.py
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
# vLLM attaches its development endpoints (/sleep, /wake_up, /is_sleeping, ...) only with this set.
DEV_MODE = os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0")


class Engine:
    """Prefix cache bookkeeping, sleep state and metrics, shared by the handler threads."""

    def __init__(self, model: str, prefix_caching: bool, details: bool, engines: int = 1,
                 sleep_mode: bool = False, sleep_delay: float = 0.05, wake_delay: float = 0.1,
                 gpu_blocks: int | None = None, offloading: bool = False, release: str = "0.34",
                 max_num_seqs: int | None = None, max_queued: int | None = None, max_model_len: int = 4096,
                 kv_cache_metrics: bool = False):
        self.model = model
        self.prefix_caching = prefix_caching
        self.details = details
        self.sleep_mode = sleep_mode
        self.sleep_delay, self.wake_delay = sleep_delay, wake_delay
        self.sleep_level = 0  # 0: awake
        self.blocks: OrderedDict[int, None] = OrderedDict()  # GPU blocks, least recently used first
        self.gpu_blocks = gpu_blocks  # --num-gpu-blocks-override: beyond it the oldest block is evicted
        self.host: set[int] | None = set() if offloading else None  # --kv-offloading-size: every block stored
        self.lock = threading.Lock()
        self.turn = 0
        self.new = release != "0.33"  # 0.34's families besides 0.33's
        self.max_model_len = max_model_len
        self.max_queued = max_queued  # --max-num-queued-reqs
        self.seats = threading.BoundedSemaphore(max_num_seqs) if max_num_seqs else None
        self.unfinished = 0
        self.held_tokens = 0  # tokens the running requests hold
        r = self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
                             registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels,
                             registry=r)
        self.sleep_state = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; "
                                 "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
                                 "discard_all = 1 means sleep level 2.", labels + ["sleep_state"], registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
                               "tokens.", labels, registry=r)
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                            labels, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r)
        self.by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                 labels + ["source"], registry=r)
        self.cached = Counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
                              labels, registry=r)
        self.gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r)
        # With a KV connector (the native CPU offload of --kv-offloading-size): what it was asked and had
        self.ext_queries = Counter("vllm:external_prefix_cache_queries", "External prefix cache queries, in terms "
                                   "of number of queried tokens.", labels, registry=r) if offloading else None
        self.ext_hits = Counter("vllm:external_prefix_cache_hits", "External prefix cache hits, in terms of number "
                                "of cached tokens.", labels, registry=r) if offloading else None
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, registry=r,
                              buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5))
        self._operator_families(r, labels, model, kv_cache_metrics, engines)
        self.lvs = [{"model_name": model, "engine": str(i)} for i in range(engines)]
        for lv in self.lvs:
            for m in (self.running, self.waiting, self.kv, self.queries, self.hits, self.prompt, self.cached,
                      self.gen, self.ttft, self.preempted, self.itl, self.e2e, self.queue, self.prefill,
                      *self.new_histograms):
                m.labels(**lv)
            for reason in FINISH_REASONS:
                self.success.labels(**lv, finished_reason=reason)
            for reason in ("capacity", "deferred"):
                self.waiting_by_reason.labels(**lv, reason=reason)
            if self.corrupted is not None:
                self.corrupted.labels(**lv)
            blocks = self.gpu_blocks or DEFAULT_GPU_BLOCKS
            self.cache_info.labels(block_size=str(BLOCK), num_gpu_blocks=str(blocks),
                                   kv_cache_size_tokens=str(blocks * BLOCK), engine=lv["engine"]).set(1)
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
                self.by_source.labels(**lv, source=source)
        self._publish_sleep()

    def _operator_families(self, r: CollectorRegistry, labels: list[str], model: str, kv_cache_metrics: bool,
                           engines: int) -> None:
        """The families operators page on, as vLLM 0.34.0's PrometheusStatLogger declares them."""
        self.preempted = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels,
                                 registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               labels + ["finished_reason"], registry=r)
        self.waiting_by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason. "
                                       "Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = "
                                       "deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
                                       "Sum of all reasons equals vllm:num_requests_waiting.", labels + ["reason"],
                                       registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             labels, registry=r, buckets=ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, registry=r, buckets=LATENCY_BUCKETS)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
                               "request.", labels, registry=r, buckets=LATENCY_BUCKETS)
        self.prefill = Histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for "
                                 "request.", labels, registry=r, buckets=LATENCY_BUCKETS)
        self.cache_info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                ["block_size", "num_gpu_blocks", "kv_cache_size_tokens", "engine"], registry=r)
        self.new_histograms: list[Histogram] = []
        self.decode = self.tpot = self.lifetime = None
        self.rejections = self.corrupted = None
        if not self.new:
            return
        self.decode = Histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for "
                                "request.", labels, registry=r, buckets=LATENCY_BUCKETS)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds", "Histogram of "
                              "time_per_output_token_seconds per request.", labels, registry=r, buckets=ITL_BUCKETS)
        self.new_histograms = [self.decode, self.tpot]
        if kv_cache_metrics:
            self.lifetime = Histogram("vllm:kv_block_lifetime_seconds", "Histogram of KV cache block lifetime from "
                                      "allocation to eviction. Sampled metrics (controlled by "
                                      "--kv-cache-metrics-sample).", labels, registry=r, buckets=RESIDENCY_BUCKETS)
            self.new_histograms.append(self.lifetime)
        self.rejections = Counter("vllm:admission_rejections", "Number of admission attempts rejected by a queue "
                                  "limit, by reason.", ["model_name", "reason"], registry=r)
        for reason in ADMISSION_REASONS:
            self.rejections.labels(model_name=model, reason=reason)
        if os.environ.get("VLLM_COMPUTE_NANS_IN_LOGITS", "0") not in ("", "0"):
            self.corrupted = Counter("vllm:corrupted_requests", "Corrupted requests, in terms of total number of "
                                     "requests with NaNs in logits.", labels, registry=r)

    def admitted(self) -> bool:
        """Whether one more request may queue (--max-num-queued-reqs); a refusal is counted by reason."""
        with self.lock:
            if self.max_queued is not None and self.unfinished + 1 > self.max_queued:
                if self.rejections is not None:
                    self.rejections.labels(model_name=self.model, reason="max_num_queued_reqs").inc()
                return False
            self.unfinished += 1
            return True

    def finished(self, lv: dict[str, str], reason: str) -> None:
        with self.lock:
            self.unfinished -= 1
        self.success.labels(**lv, finished_reason=reason).inc()

    def run(self, lv: dict[str, str], tokens: int) -> float:
        """Wait for a seat among --max-num-seqs (seconds waited: the queue time); a request whose tokens do
        not fit in the GPU blocks beside the running ones preempts one of them (counted, not simulated)."""
        t0 = time.perf_counter()
        if self.seats is not None:
            self.waiting.labels(**lv).inc()
            self.waiting_by_reason.labels(**lv, reason="capacity").inc()
            self.seats.acquire()
            self.waiting.labels(**lv).dec()
            self.waiting_by_reason.labels(**lv, reason="capacity").dec()
        with self.lock:
            if self.held_tokens and self.held_tokens + tokens > (self.gpu_blocks or DEFAULT_GPU_BLOCKS) * BLOCK:
                self.preempted.labels(**lv).inc()
            self.held_tokens += tokens
        return time.perf_counter() - t0

    def leave(self, tokens: int) -> None:
        with self.lock:
            self.held_tokens -= tokens
        if self.seats is not None:
            self.seats.release()

    def next_engine(self) -> dict[str, str]:
        """The labels of the engine that takes the next request (round-robin, as DP load balancing may)."""
        with self.lock:
            self.turn += 1
            return self.lvs[self.turn % len(self.lvs)]

    def _publish_sleep(self) -> None:
        for lv in self.lvs:
            for state, level in (("awake", 0), ("weights_offloaded", 1), ("discard_all", 2)):
                on = self.sleep_level == 0 if state == "awake" else self.sleep_level == level
                self.sleep_state.labels(**lv, sleep_state=state).set(1 if on else 0)

    def sleep(self, level: int) -> None:
        time.sleep(self.sleep_delay)
        with self.lock:
            self.sleep_level = level
            if level == 2:
                self.blocks.clear()
            self._publish_sleep()

    def wake(self) -> None:
        time.sleep(self.wake_delay)
        with self.lock:
            self.sleep_level = 0
            self._publish_sleep()

    def admit(self, tokens: list[str], lv: dict[str, str]) -> int:
        """Cached tokens for this prompt: whole blocks the GPU cache holds, then (with a KV offload) the blocks
        after those that host memory holds; then remember its blocks (the GPU cache evicts its least
        recently used block past its size, the host keeps every one)."""
        hashes = [hash(tuple(tokens[: (i + 1) * BLOCK])) for i in range(len(tokens) // BLOCK)]
        with self.lock:
            local = external = 0
            if self.prefix_caching:
                for h in hashes:
                    if h not in self.blocks:
                        break
                    local += BLOCK
                if self.host is not None:
                    for h in hashes[local // BLOCK:]:
                        if h not in self.host:
                            break
                        external += BLOCK
                    self.ext_queries.labels(**lv).inc(len(tokens) - local)  # type: ignore[union-attr]
                    self.ext_hits.labels(**lv).inc(external)  # type: ignore[union-attr]
                    self.host.update(hashes)
                for h in hashes:
                    self.blocks[h] = None
                    self.blocks.move_to_end(h)
                while self.gpu_blocks is not None and len(self.blocks) > self.gpu_blocks:
                    self.blocks.popitem(last=False)
            cached = local + external
            self.queries.labels(**lv).inc(len(tokens))
            self.hits.labels(**lv).inc(local)
            self.prompt.labels(**lv).inc(len(tokens))
            self.cached.labels(**lv).inc(cached)
            self.by_source.labels(**lv, source="local_compute").inc(len(tokens) - cached)
            self.by_source.labels(**lv, source="local_cache_hit").inc(local)
            self.by_source.labels(**lv, source="external_kv_transfer").inc(external)
            self.kv.labels(**lv).set(min(1.0, len(self.blocks) / (self.gpu_blocks or DEFAULT_GPU_BLOCKS)))
        return cached


def prompt_tokens(body: dict, chat: bool) -> list[str]:
    """The prompt as the double tokenizes it: one token a whitespace-separated word, plus its chat template's
    CHAT_TEMPLATE_TOKENS per message."""
    if not chat:
        return str(body.get("prompt", "")).split()
    words: list[str] = []
    for m in body.get("messages") or []:
        content = m.get("content", "") if isinstance(m, dict) else ""
        words += ["<|im|>"] * CHAT_TEMPLATE_TOKENS + str(content).split()
    return words


def make_handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: object) -> None:
            sys.stdout.write("INFO:     %s - %s\n" % (self.address_string(), fmt % args))
            sys.stdout.flush()

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/v1/models":
                data = {"object": "list", "data": [{"id": engine.model, "object": "model", "owned_by": "vllm",
                                                    "root": engine.model, "max_model_len": engine.max_model_len}]}
                self._send(200, json.dumps(data).encode())
            elif self.path == "/metrics":
                self._send(200, generate_latest(engine.registry), "text/plain; version=0.0.4; charset=utf-8")
            elif self.path == "/is_sleeping" and DEV_MODE:
                self._send(200, json.dumps({"is_sleeping": engine.sleep_level > 0}).encode())
            else:
                self._send(404, json.dumps({"detail": "Not Found"}).encode())

        def _sleep_endpoints(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/sleep":
                level = int(parse_qs(url.query).get("level", ["1"])[0])
                if not engine.sleep_mode:  # vLLM's engine refuses: sleep mode was not enabled at start
                    self._send(500, json.dumps({"error": {"message": "Sleep mode is not enabled in the "
                                                          "model config", "code": 500}}).encode())
                    return
                engine.sleep(level)
                self._send(200, json.dumps({"status": "sleeping", "level": level}).encode())
            else:
                engine.wake()
                self._send(200, json.dumps({"status": "awake", "tags": None}).encode())

        def _error(self, code: int, message: str, kind: str, param: str | None = None) -> None:
            """vLLM's ErrorResponse (vllm/entrypoints/serve/engine/protocol.py)."""
            body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
            self._send(code, json.dumps(body).encode())

        def do_POST(self) -> None:
            chat = self.path == "/v1/chat/completions"
            if DEV_MODE and urlsplit(self.path).path in ("/sleep", "/wake_up"):
                self._sleep_endpoints()
                return
            if self.path not in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
                self._send(404, json.dumps({"detail": "Not Found"}).encode())
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/tokenize":
                self._tokenize(body)
                return
            if body.get("model") != engine.model:
                self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
                return
            tokens = prompt_tokens(body, chat)
            if len(tokens) > engine.max_model_len:
                self._error(400, f"This model's maximum context length is {engine.max_model_len} tokens. However, "
                                 f"your prompt contains {len(tokens)} input tokens, which exceeds this limit even "
                                 "without any output tokens. Please reduce the length of the input prompt.",
                            "BadRequestError", "input_tokens")
                return
            if not engine.admitted():
                self._error(503, "The server is overloaded: the request queue is full.", "ServiceUnavailableError")
                return
            self._complete(body, tokens, chat)

        def _tokenize(self, body: dict) -> None:
            messages = body.get("messages")
            tokens = prompt_tokens(body, chat=messages is not None)
            self._send(200, json.dumps({"count": len(tokens), "max_model_len": engine.max_model_len,
                                        "tokens": list(range(len(tokens)))}).encode())

        def _complete(self, body: dict, tokens: list[str], chat: bool) -> None:
            t0 = time.perf_counter()
            lv = engine.next_engine()
            queued = engine.run(lv, len(tokens))
            engine.queue.labels(**lv).observe(queued)
            engine.running.labels(**lv).inc()
            reason = "abort"
            try:
                t_run = time.perf_counter()
                cached = engine.admit(tokens, lv)
                time.sleep((len(tokens) - cached) * PREFILL_S_PER_TOKEN)
                n = int(body.get("max_tokens") or 16)
                usage = {"prompt_tokens": len(tokens), "completion_tokens": n, "total_tokens": len(tokens) + n}
                if engine.details:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
                obj = "chat.completion.chunk" if chat else "text_completion"

                def first_token() -> float:
                    now = time.perf_counter()
                    engine.ttft.labels(**lv).observe(now - t0)
                    engine.prefill.labels(**lv).observe(now - t_run)
                    return now

                def done(t_first: float) -> None:
                    now = time.perf_counter()
                    engine.e2e.labels(**lv).observe(now - t0)
                    if engine.decode is not None:
                        engine.decode.labels(**lv).observe(now - t_first)
                    if engine.tpot is not None and n > 1:
                        engine.tpot.labels(**lv).observe((now - t_first) / (n - 1))
                    engine.gen.labels(**lv).inc(n)

                def choice(word: str | None, finish: str | None) -> dict:
                    if chat:
                        return {"index": 0, "delta": {} if word is None else {"content": word},
                                "finish_reason": finish}
                    return {"index": 0, "text": word or "", "finish_reason": finish}

                if not body.get("stream"):
                    content = " ".join("tok" for _ in range(n))
                    t_first = first_token()
                    for _ in range(n - 1):
                        time.sleep(DECODE_S_PER_TOKEN)
                        engine.itl.labels(**lv).observe(DECODE_S_PER_TOKEN)
                    c = ({"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}
                         if chat else {"index": 0, "text": content, "finish_reason": "length"})
                    out = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                           "model": engine.model, "choices": [c], "usage": usage}
                    self._send(200, json.dumps(out).encode())
                    done(t_first)
                    reason = "length"
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def event(payload: dict | str) -> None:
                    data = payload if isinstance(payload, str) else json.dumps(payload)
                    raw = f"data: {data}\n\n".encode()
                    self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
                    self.wfile.flush()

                def chunk(choices: list, **extra: object) -> dict:
                    return {"id": rid, "object": obj, "created": int(time.time()), "model": engine.model,
                            "choices": choices, **extra}

                if chat:  # vLLM's first chat chunk carries the role and empty content, after prefill
                    event(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]))
                t_first = t_last = time.perf_counter()
                for i in range(n):
                    if i == 0:
                        t_first = t_last = first_token()
                    else:
                        time.sleep(DECODE_S_PER_TOKEN)
                        now = time.perf_counter()
                        engine.itl.labels(**lv).observe(now - t_last)
                        t_last = now
                    event(chunk([choice(" tok", "length" if i == n - 1 else None)]))
                if (body.get("stream_options") or {}).get("include_usage"):
                    event(chunk([], usage=usage))
                event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                done(t_first)
                reason = "length"
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away: an abort, as vLLM counts it
            finally:
                engine.running.labels(**lv).dec()
                engine.leave(len(tokens))
                engine.finished(lv, reason)

    return Handler


class EnableDisable(argparse.Action):
    """A boolean flag listed as `--enable-x, --disable-x` (or `--x, --no-x`), as vLLM 0.33 prints its
    booleans; the argparse negation of an enable flag (`--no-enable-x`) is registered hidden."""

    def __init__(self, option_strings: list[str], dest: str, **kw: object) -> None:
        flag = option_strings[0]
        other = ("--disable-" + flag[len("--enable-"):]) if flag.startswith("--enable-") else "--no-" + flag[2:]
        self.negatives = {other}
        kw.pop("nargs", None)
        super().__init__([flag, other], dest, nargs=0, **kw)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, option_string not in self.negatives)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm", description="vLLM test double (see module docstring)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="Start the OpenAI-compatible server (double).")
    s.add_argument("model", nargs="?")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    # vllm/entrypoints/openai/cli_args.py (--api-key) and vllm/engine/arg_utils.py (--hf-token): accepted, unused
    s.add_argument("--api-key", default=None)
    s.add_argument("--hf-token", default=None)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    s.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    s.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    s.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    s.add_argument("--max-model-len", type=str, default=None)
    s.add_argument("--max-num-seqs", type=int, default=None)
    s.add_argument("--kv-offloading-size", type=float, default=None)
    s.add_argument("--num-gpu-blocks-override", type=int, default=None)
    s.add_argument("--kv-offloading-backend", choices=["native", "lmcache"], default="native")
    s.add_argument("--enforce-eager", action=EnableDisable, default=False)
    s.add_argument("--enable-prefix-caching", action=EnableDisable, default=True)
    s.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help=argparse.SUPPRESS)
    s.add_argument("--enable-sleep-mode", action=EnableDisable, default=False)
    s.add_argument("--enable-prompt-tokens-details", action=EnableDisable, default=False)
    s.add_argument("--max-num-queued-reqs", type=int, default=None)
    s.add_argument("--kv-cache-metrics", action=EnableDisable, default=False)
    s.add_argument("--release", choices=["0.33", "0.34"], default="0.34", help="Which vLLM's metrics to reproduce.")
    s.add_argument("--load-delay", type=float, default=0.5, help="Seconds before the port is bound (loading).")
    s.add_argument("--sleep-delay", type=float, default=0.05, help="Seconds a POST /sleep takes.")
    s.add_argument("--wake-delay", type=float, default=0.1, help="Seconds a POST /wake_up takes.")
    # vLLM's `serve --help=all` lists every flag; argparse's --help takes no value.
    return p.parse_args(["--help" if a.startswith("--help") else a for a in argv])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(f"INFO: vllm double: loading {args.model} (gpu_memory_utilization={args.gpu_memory_utilization}, "
          f"tp={args.tensor_parallel_size}, enforce_eager={args.enforce_eager})", flush=True)
    time.sleep(args.load_delay)
    engine = Engine(args.model, args.enable_prefix_caching, args.enable_prompt_tokens_details,
                    engines=args.data_parallel_size, sleep_mode=args.enable_sleep_mode,
                    sleep_delay=args.sleep_delay, wake_delay=args.wake_delay,
                    gpu_blocks=args.num_gpu_blocks_override, offloading=args.kv_offloading_size is not None,
                    release=args.release, max_num_seqs=args.max_num_seqs, max_queued=args.max_num_queued_reqs,
                    max_model_len=int(args.max_model_len or 4096), kv_cache_metrics=args.kv_cache_metrics)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(engine))
    server.daemon_threads = True
    print(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", flush=True)
    print("INFO 01-01 00:00:00 metrics.py:1] Avg prompt throughput: 0.0 tokens/s, "
          "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
