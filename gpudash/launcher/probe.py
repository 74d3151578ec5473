"""The probe workload: streaming chat requests that measure what a user feels.

Each request records the client-side time to first token (first streamed chunk carrying output), the
prompt and cached token counts the server reports (llama-server `timings.cache_n`, OpenAI/vLLM
`usage.prompt_tokens_details.cached_tokens`), the total time and the server's own `prompt_ms`.
A `shared_prefix` fraction of the requests starts with one fixed prefix (prefix-cache hits after the first);
the rest are all-new text (misses), so the TTFT-vs-hit correlation has both kinds to compare.
"""

from __future__ import annotations

import json
import random
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import httpx

from gpudash.records import RequestSample

if TYPE_CHECKING:
    from gpudash.config import ProbeConfig
    from gpudash.launcher.supervisor import Pushable, Supervisor

# Share of a shared-prefix prompt that is the common prefix; the rest is new text per request.
PREFIX_SHARE = 0.9
REQUEST_TIMEOUT_S = 120.0
# How long ProbeRunner.stop waits for a round in flight before the caller goes on to stop the servers.
STOP_WAIT_S = 5.0

_WORDS = ("time person year way day thing man world life hand part child eye woman place work week case "
          "point government company number group problem fact water room mother area money story month lot "
          "right study book job word business issue side kind head house service friend father power hour "
          "game line end member law car city community name president team minute idea kid body information "
          "back parent face others level office door health art war history party result change morning "
          "reason research girl guy moment air teacher force education river stone garden cloud bridge").split()


class PromptMaker:
    """Prompts of about `words` words; request i uses the shared prefix for a `shared_prefix` fraction of i.

    The choice is spread evenly (not random) so small runs hold the asked fraction exactly.
    """

    def __init__(self, words: int, shared_prefix: float, seed: int = 0):
        if not 0.0 <= shared_prefix <= 1.0:
            raise ValueError(f"shared_prefix must be between 0 and 1, got {shared_prefix}")
        self.words = max(1, words)
        self.shared_prefix = shared_prefix
        self._rng = random.Random(seed)
        self._prefix = self._text(max(1, round(self.words * PREFIX_SHARE)))
        self._i = 0
        self._lock = threading.Lock()

    def _text(self, n: int) -> str:
        return " ".join(self._rng.choice(_WORDS) for _ in range(n))

    def next(self) -> tuple[str, bool]:
        """The next prompt and whether it starts with the shared prefix."""
        with self._lock:
            i, self._i = self._i, self._i + 1
            shared = int((i + 1) * self.shared_prefix) > int(i * self.shared_prefix)
            # A leading nonce makes an unshared prompt differ from its first token on.
            if shared:
                tail = self._text(max(1, self.words - round(self.words * PREFIX_SHARE)))
                return f"{self._prefix} {tail}", True
            return f"{self._rng.getrandbits(32):08x} {self._text(self.words)}", False


def _sse_data(lines: Iterator[str]) -> Iterator[dict]:
    """JSON payloads of an OpenAI-style event stream's `data:` lines, up to `[DONE]`."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        if data:
            yield json.loads(data)


def _carries_output(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") is not None or delta.get("reasoning_content") is not None:
            return True
        if choice.get("text") is not None or choice.get("finish_reason") is not None:
            return True
    return False


def model_id(client: httpx.Client, base_url: str) -> str:
    """The first model id /v1/models lists (vLLM requires it in requests; llama-server accepts any)."""
    r = client.get(f"{base_url}/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise ValueError(f"{base_url}/v1/models lists no model")
    return str(data[0]["id"])


def probe_request(client: httpx.Client, base_url: str, model: str, prompt: str, max_tokens: int,
                  server: str) -> RequestSample:
    """One streaming chat completion, timed from send to first output chunk and to the end of the stream."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    ts = time.time()
    t0 = time.perf_counter()
    ttft = None
    usage: dict = {}
    timings: dict = {}
    try:
        with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                return RequestSample(ts=ts, server=server, ttft_s=None, total_s=time.perf_counter() - t0,
                                     prompt_tokens=None, cached_tokens=None, ok=False,
                                     error=f"HTTP {r.status_code}: {r.text[:200]}")
            for chunk in _sse_data(r.iter_lines()):
                if ttft is None and _carries_output(chunk):
                    ttft = time.perf_counter() - t0
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
    except (httpx.HTTPError, ValueError) as err:
        return RequestSample(ts=ts, server=server, ttft_s=ttft, total_s=time.perf_counter() - t0,
                             prompt_tokens=None, cached_tokens=None, ok=False, error=f"{type(err).__name__}: {err}")
    total = time.perf_counter() - t0
    details = usage.get("prompt_tokens_details") or {}
    cached = timings.get("cache_n", details.get("cached_tokens"))
    prompt_tokens = usage.get("prompt_tokens")
    if prompt_tokens is None and "prompt_n" in timings:
        prompt_tokens = timings["prompt_n"] + timings.get("cache_n", 0)
    return RequestSample(ts=ts, server=server, ttft_s=ttft, total_s=total, prompt_tokens=prompt_tokens,
                         cached_tokens=cached, completion_tokens=usage.get("completion_tokens"),
                         server_prompt_ms=timings.get("prompt_ms"))


def run_probe(base_url: str, requests: int, concurrency: int = 1, shared_prefix: float = 0.5,
              prompt_words: int = 256, max_tokens: int = 16, server: str | None = None,
              seed: int = 0) -> list[RequestSample]:
    """Send `requests` probe requests, `concurrency` at a time; results in completion order.

    Raises httpx.HTTPError / ValueError when the server cannot be reached or lists no model.
    """
    base_url = base_url.rstrip("/").removesuffix("/v1")  # "http://host:8000/v1" is how OpenAI clients say it
    name = server or base_url.split("://", 1)[-1]
    maker = PromptMaker(prompt_words, shared_prefix, seed)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, limits=limits, trust_env=False) as client:
        model = model_id(client, base_url)

        def one(_: int) -> RequestSample:
            return probe_request(client, base_url, model, maker.next()[0], max_tokens, name)

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="gpudash-probe") as pool:
            return list(pool.map(one, range(requests)))


class ProbeRunner:
    """Background thread: every `interval_s`, one round of `concurrency` probe requests per ready server.

    Results go to the inbox (and so into the snapshot's `requests` and the store).
    """

    def __init__(self, supervisor: Supervisor, config: ProbeConfig, inbox: Pushable):
        self._sup = supervisor
        self._cfg = config
        self._inbox = inbox
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._makers: dict[str, PromptMaker] = {}
        self._models: dict[tuple[str, int | None], str] = {}

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="gpudash-probe-runner")
            self._thread.start()

    def stop(self) -> None:
        """No new rounds; a round in flight ends when its requests do (or when the servers stop)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_S)
            self._thread = None

    def _run(self) -> None:
        c = self._cfg
        limits = httpx.Limits(max_connections=c.concurrency * 8)
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, limits=limits, trust_env=False) as client, \
                ThreadPoolExecutor(max_workers=c.concurrency, thread_name_prefix="gpudash-probe") as pool:
            while not self._stop.is_set():
                for st in self._sup.states():
                    if st.state == "ready" and not self._stop.is_set():
                        self._round(client, pool, st.server, st.pid)
                self._stop.wait(c.interval_s)

    def _round(self, client: httpx.Client, pool: ThreadPoolExecutor, server: str, pid: int | None) -> None:
        base = self._sup.base_url(server)
        if base is None:
            return
        c = self._cfg
        maker = self._makers.setdefault(server, PromptMaker(c.prompt_tokens, c.shared_prefix,
                                                            seed=zlib.crc32(server.encode())))
        try:
            model = self._models.get((server, pid)) or model_id(client, base)
        except (httpx.HTTPError, ValueError) as err:
            self._inbox.push(RequestSample(ts=time.time(), server=server, ttft_s=None, total_s=None,
                                           prompt_tokens=None, cached_tokens=None, ok=False,
                                           error=f"/v1/models: {err}"))
            return
        self._models[(server, pid)] = model
        prompts = [maker.next()[0] for _ in range(c.concurrency)]
        for sample in pool.map(lambda p: probe_request(client, base, model, p, c.max_tokens, server), prompts):
            self._inbox.push(sample)
