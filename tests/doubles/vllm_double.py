"""A test double of `vllm serve`: a real HTTP server process reproducing vLLM's documented surface.

It is not vLLM: no model runs. It exists so the launcher's vLLM path (argv, health gating, /metrics
names, streaming usage with cached tokens) is exercised against a real process on 127.0.0.1 in CI,
where vLLM and GPUs are absent. What it reproduces:

* the command line `vllm serve MODEL --host H --port P [...flags]` and `vllm serve --help=all`;
* refusing connections until "loaded" (the socket is bound only after `--load-delay` seconds);
* GET /health (200), GET /v1/models, POST /v1/completions and /v1/chat/completions, streaming (SSE with
  `data: [DONE]`) or not, with `usage` and, with --enable-prompt-tokens-details,
  `usage.prompt_tokens_details.cached_tokens`;
* automatic prefix caching in blocks of 16 tokens (one token = one whitespace-separated word), with
  prompt processing time proportional to the uncached tokens, so hits have lower TTFT;
* GET /metrics with vLLM's names: vllm:num_requests_running / waiting, vllm:kv_cache_usage_perc,
  vllm:prefix_cache_queries_total / hits_total, vllm:prompt_tokens_total, vllm:generation_tokens_total
  and the vllm:time_to_first_token_seconds histogram (labels model_name, engine).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BLOCK = 16
PREFILL_S_PER_TOKEN = 0.0004
DECODE_S_PER_TOKEN = 0.001


class Engine:
    """Prefix cache bookkeeping and metrics, shared by the handler threads."""

    def __init__(self, model: str, prefix_caching: bool, details: bool):
        self.model = model
        self.prefix_caching = prefix_caching
        self.details = details
        self.blocks: set[int] = set()
        self.lock = threading.Lock()
        r = self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.running = Gauge("vllm:num_requests_running", "Requests running", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", labels, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent", labels, registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens", labels, registry=r)
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens", labels, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prefill tokens processed", labels, registry=r)
        self.gen = Counter("vllm:generation_tokens", "Generation tokens processed", labels, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", labels, registry=r,
                              buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5))
        self.lv = {"model_name": model, "engine": "0"}
        for m in (self.running, self.waiting, self.kv, self.queries, self.hits, self.prompt, self.gen, self.ttft):
            m.labels(**self.lv)

    def admit(self, tokens: list[str]) -> int:
        """Cached tokens for this prompt (whole blocks already seen), then remember its blocks."""
        hashes = [hash(tuple(tokens[: (i + 1) * BLOCK])) for i in range(len(tokens) // BLOCK)]
        with self.lock:
            cached = 0
            if self.prefix_caching:
                for h in hashes:
                    if h not in self.blocks:
                        break
                    cached += BLOCK
                self.blocks.update(hashes)
            self.queries.labels(**self.lv).inc(len(tokens))
            self.hits.labels(**self.lv).inc(cached)
            self.prompt.labels(**self.lv).inc(len(tokens))
            self.kv.labels(**self.lv).set(min(1.0, len(self.blocks) * BLOCK / 100_000))
        return cached


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
                                                    "root": engine.model, "max_model_len": 4096}]}
                self._send(200, json.dumps(data).encode())
            elif self.path == "/metrics":
                self._send(200, generate_latest(engine.registry), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._send(404, json.dumps({"detail": "Not Found"}).encode())

        def do_POST(self) -> None:
            chat = self.path == "/v1/chat/completions"
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                self._send(404, json.dumps({"detail": "Not Found"}).encode())
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if body.get("model") != engine.model:
                err = {"object": "error", "message": f"The model `{body.get('model')}` does not exist.",
                       "type": "NotFoundError", "code": 404}
                self._send(404, json.dumps(err).encode())
                return
            text = " ".join(m.get("content", "") for m in body.get("messages", [])) if chat else str(body.get("prompt", ""))
            self._complete(body, text.split(), chat)

        def _complete(self, body: dict, tokens: list[str], chat: bool) -> None:
            t0 = time.perf_counter()
            lv = engine.lv
            engine.running.labels(**lv).inc()
            try:
                cached = engine.admit(tokens)
                time.sleep((len(tokens) - cached) * PREFILL_S_PER_TOKEN)
                n = int(body.get("max_tokens") or 16)
                usage = {"prompt_tokens": len(tokens), "completion_tokens": n, "total_tokens": len(tokens) + n}
                if engine.details:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
                obj = "chat.completion.chunk" if chat else "text_completion"

                def choice(word: str | None, finish: str | None) -> dict:
                    if chat:
                        return {"index": 0, "delta": {} if word is None else {"content": word},
                                "finish_reason": finish}
                    return {"index": 0, "text": word or "", "finish_reason": finish}

                if not body.get("stream"):
                    content = " ".join("tok" for _ in range(n))
                    engine.ttft.labels(**lv).observe(time.perf_counter() - t0)
                    time.sleep(n * DECODE_S_PER_TOKEN)
                    c = ({"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}
                         if chat else {"index": 0, "text": content, "finish_reason": "length"})
                    out = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                           "model": engine.model, "choices": [c], "usage": usage}
                    self._send(200, json.dumps(out).encode())
                    engine.gen.labels(**lv).inc(n)
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
                for i in range(n):
                    if i == 0:
                        engine.ttft.labels(**lv).observe(time.perf_counter() - t0)
                    else:
                        time.sleep(DECODE_S_PER_TOKEN)
                    event(chunk([choice(" tok", "length" if i == n - 1 else None)]))
                if (body.get("stream_options") or {}).get("include_usage"):
                    event(chunk([], usage=usage))
                event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                engine.gen.labels(**lv).inc(n)
            finally:
                engine.running.labels(**lv).dec()

    return Handler


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm", description="vLLM test double (see module docstring)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="Start the OpenAI-compatible server (double).")
    s.add_argument("model", nargs="?")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    s.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    s.add_argument("--enforce-eager", action="store_true")
    s.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    s.add_argument("--enable-sleep-mode", action="store_true")
    s.add_argument("--enable-prompt-tokens-details", action="store_true")
    s.add_argument("--load-delay", type=float, default=0.5, help="Seconds before the port is bound (loading).")
    # vLLM's `serve --help=all` lists every flag; argparse's --help takes no value.
    return p.parse_args(["--help" if a.startswith("--help") else a for a in argv])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(f"INFO: vllm double: loading {args.model} (gpu_memory_utilization={args.gpu_memory_utilization}, "
          f"tp={args.tensor_parallel_size}, enforce_eager={args.enforce_eager})", flush=True)
    time.sleep(args.load_delay)
    engine = Engine(args.model, args.enable_prefix_caching, args.enable_prompt_tokens_details)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(engine))
    server.daemon_threads = True
    print(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", flush=True)
    print("INFO 01-01 00:00:00 metrics.py:1] Avg prompt throughput: 0.0 tokens/s, "
          "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
