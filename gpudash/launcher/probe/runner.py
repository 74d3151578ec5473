"""The probe workload: streaming chat requests that measure what a user feels.

Each request records the client-side time to first token (first streamed chunk carrying output), the
prompt and cached token counts the server reports (llama-server `timings.cache_n`, OpenAI/vLLM
`usage.prompt_tokens_details.cached_tokens`), the total time and the server's own `prompt_ms`.
A `shared_prefix` fraction of the requests starts with one fixed prefix (prefix-cache hits after the first);
the rest are all-new text (misses), so the TTFT-vs-hit correlation has both kinds to compare.
Whatever a server does (stall, drip, flood, answer nonsense), a request ends by its deadline as one
sample; the bounded reading itself is client.py's job.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import random
import threading
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpudash.launcher.probe import sizing
from gpudash.launcher.probe.client import (MAX_BODY_BYTES, Cutoff, ProbeFailure, error_line, parse_json, read_capped,
                                         read_prefix, sse_data)
from gpudash.records import Event, RequestSample, ServerState
from gpudash.redact import mask_values

if TYPE_CHECKING:
    from gpudash.config import ProbeConfig
    from gpudash.launcher.supervisor import Pushable, Supervisor

# Share of a shared-prefix prompt that is the common prefix; the rest is new text per request.
PREFIX_SHARE = 0.9
# Whole-request deadline when the caller names none ([probe] timeout_s in launch/serve).
DEFAULT_DEADLINE_S = 60.0
# How long ProbeRunner.stop waits for a round in flight before the caller goes on to stop the servers.
STOP_WAIT_S = 5.0
# Distinct errors per server that each get an event (a server answering with ever-new texts stays bounded).
MAX_DISTINCT_ERRORS = 50

# How often the thread waiting for probe results wakes (so a signal delivered to another thread is handled).
_WAKE_S = 0.1
_RAW = {"Accept-Encoding": "identity"}  # bytes on the wire are what the caps count: no decompression bombs
# A request that got no answer at all on these is sent once more, on a new connection: a server may close
# an idle keep-alive connection just as the pool hands it out (cpp-httplib's and uvicorn's defaults close
# one after 5 s idle), and httpcore retries only failed connects. A duplicate costs one more request.
_UNANSWERED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
_T = TypeVar("_T")
_Count = Annotated[int, Field(ge=0, lt=2**63)]
log = logging.getLogger(__name__)


class _Shape(BaseModel):
    """What the probe reads of a server's JSON; anything else the server adds is ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


_S = TypeVar("_S", bound=_Shape)
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}

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


class _Delta(_Shape):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(_Shape):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None

    def carries_output(self) -> bool:
        d = self.delta
        return (d is not None and (d.content is not None or d.reasoning_content is not None)) \
            or self.text is not None or self.finish_reason is not None


class _PromptDetails(_Shape):
    cached_tokens: _Count | None = None


class _Usage(_Shape):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Timings(_Shape):
    """llama-server's per-request timings."""

    prompt_n: _Count | None = None
    cache_n: _Count | None = None
    prompt_ms: float | None = Field(None, ge=0, allow_inf_nan=False)


class _Chunk(_Shape):
    """One chat-completion stream chunk, as far as the probe reads it."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    timings: _Timings | None = None


class _ModelEntry(_Shape):
    id: str = Field(min_length=1)


class _Models(_Shape):
    data: list[_ModelEntry]


def _shaped(shape: type[_S], value: Any, what: str) -> _S:
    """`value` read as `shape`, or a ProbeFailure saying in one sentence where it is wrong."""
    try:
        return shape.model_validate(value)
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"]) or "the top level"
        msg = e["msg"].split(" or instance of ")[0].replace("valid dictionary", "JSON object")
        got = _JSON_TYPES.get(type(e["input"]), "something else")
        raise ProbeFailure(f"{what} has the wrong shape at {where}: {msg}, got {got}") from None


def model_id(client: httpx.Client, base_url: str, deadline_s: float = DEFAULT_DEADLINE_S,
             cutoff: Cutoff | None = None, auth: dict[str, str] | None = None) -> str:
    """The first model id /v1/models lists (vLLM requires it in requests; llama-server accepts any).

    Raises httpx.HTTPError or ProbeFailure (a ValueError) in one sentence when there is none to be had.
    """
    cutoff = cutoff or Cutoff()
    deadline = time.monotonic() + deadline_s
    what = f"{base_url}/v1/models"
    late = ProbeFailure(f"{what} did not answer within {deadline_s:g} s")
    fired = None
    try:
        with client.stream("GET", what, headers={**_RAW, **(auth or {})}, timeout=cutoff.timeout(deadline),
                           extensions=cutoff.extensions) as r, \
                cutoff.watch(r, deadline) as fired:
            if r.status_code != 200:
                raise ProbeFailure(f"{what} answered {error_line(r.status_code, read_prefix(r))}")
            try:
                body = read_capped(r, MAX_BODY_BYTES, deadline)
            except ProbeFailure as err:
                raise late if fired.is_set() else ProbeFailure(f"{what}: {err}") from None
            if fired.is_set():  # the deadline shut the connection: what was read is cut short
                raise late
    except httpx.TimeoutException:
        raise late from None
    except httpx.HTTPError:
        if cutoff.cancelled:
            raise ProbeFailure("the probe was stopped") from None
        if fired is not None and fired.is_set():
            raise late from None
        raise
    models = _shaped(_Models, parse_json(body, what), what)
    if not models.data:
        raise ProbeFailure(f"{what} lists no model")
    return models.data[0].id


def probe_request(client: httpx.Client, base_url: str, model: str, prompt: str, max_tokens: int,
                  server: str, deadline_s: float = DEFAULT_DEADLINE_S, cutoff: Cutoff | None = None,
                  auth: dict[str, str] | None = None) -> RequestSample:
    """One streaming chat completion, timed from send to first output chunk and to the end of the stream.

    Never raises for what the server does: a failure (no answer within `deadline_s` for the whole request,
    an error status, a malformed or oversized answer, a stream without output) is a sample with ok=False.
    """
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    ts = time.time()
    t0 = time.perf_counter()
    deadline = time.monotonic() + deadline_s
    cutoff = cutoff or Cutoff()
    ttft = None
    usage = _Usage()
    timings = _Timings()

    def failed(error: str) -> RequestSample:
        return RequestSample(ts=ts, server=server, ttft_s=ttft, total_s=time.perf_counter() - t0,
                             prompt_tokens=None, cached_tokens=None, ok=False, error=error)

    for attempt in (1, 2):
        fired = None
        answered = False
        try:
            with client.stream("POST", f"{base_url}/v1/chat/completions", json=body,
                               headers={**_RAW, **(auth or {})}, timeout=cutoff.timeout(deadline),
                               extensions=cutoff.extensions) as r, cutoff.watch(r, deadline) as fired:
                answered = True
                if r.status_code != 200:
                    return failed(error_line(r.status_code, read_prefix(r)))
                for n, data in enumerate(sse_data(r, deadline)):
                    chunk = _shaped(_Chunk, parse_json(data, f"stream chunk {n}"), f"stream chunk {n}")
                    if ttft is None and any(c.carries_output() for c in chunk.choices or ()):
                        ttft = time.perf_counter() - t0
                    usage = chunk.usage or usage
                    timings = chunk.timings or timings
                if fired.is_set():
                    raise ProbeFailure("cut off")
        except (ProbeFailure, httpx.HTTPError) as err:
            # whatever broke after a stop or at the deadline (a shut socket, a pooled connection gone) is that
            if cutoff.cancelled or (fired is not None and fired.is_set()):
                return failed(_cut_off(cutoff, deadline_s))
            if attempt == 1 and not answered and isinstance(err, _UNANSWERED):
                ts, t0 = time.time(), time.perf_counter()  # the request timed is the one sent again
                continue
            if isinstance(err, httpx.TimeoutException):
                return failed(f"no answer within the request deadline of {deadline_s:g} s")
            return failed(str(err) if isinstance(err, ProbeFailure) else f"{type(err).__name__}: {err}")
        break
    if ttft is None:
        return failed("HTTP 200 but the stream carried no output")
    total = time.perf_counter() - t0
    details = usage.prompt_tokens_details or _PromptDetails()
    cached = timings.cache_n if timings.cache_n is not None else details.cached_tokens
    prompt_tokens = usage.prompt_tokens
    if prompt_tokens is None and timings.prompt_n is not None:
        prompt_tokens = timings.prompt_n + (timings.cache_n or 0)
    return RequestSample(ts=ts, server=server, ttft_s=ttft, total_s=total, prompt_tokens=prompt_tokens,
                         cached_tokens=cached, completion_tokens=usage.completion_tokens,
                         server_prompt_ms=timings.prompt_ms)


def _cut_off(cutoff: Cutoff, deadline_s: float) -> str:
    """Why a request whose socket was shut ended: a stop, or its deadline."""
    if cutoff.cancelled:
        return "the probe was stopped"
    return f"no complete answer within the request deadline of {deadline_s:g} s"


def _in_daemons(jobs: list[Callable[[], _T]], concurrency: int) -> list[_T]:
    """Run `jobs`, `concurrency` at a time, on daemon threads; results in completion order.

    Daemon threads, not a ThreadPoolExecutor: an executor's workers are joined at interpreter exit, so a
    request stuck in a read would keep Ctrl-C from ending the program. The jobs must not raise.
    """
    todo = iter(jobs)
    lock = threading.Lock()
    done: queue.SimpleQueue[_T] = queue.SimpleQueue()

    def work() -> None:
        while True:
            with lock:
                job = next(todo, None)
            if job is None:
                return
            done.put(job())

    for i in range(min(concurrency, len(jobs))):
        threading.Thread(target=work, daemon=True, name=f"gpudash-probe-{i}").start()
    out: list[_T] = []
    while len(out) < len(jobs):
        try:  # never an endless wait: a Ctrl-C taken by a worker thread runs only when this thread runs Python
            out.append(done.get(timeout=_WAKE_S))
        except queue.Empty:
            pass
    return out


def sized_maker(client: httpx.Client, base_url: str, model: str, tokens: int, max_tokens: int, shared_prefix: float,
                seed: int, deadline_s: float, cutoff: Cutoff, auth: dict[str, str] | None = None) -> PromptMaker:
    """A PromptMaker whose prompts have about `tokens` tokens on this server's tokenizer, fitted to its slot
    (sizing.py); words count as tokens where the server cannot say."""
    sample = PromptMaker(sizing.SAMPLE_WORDS, 0.0, seed).next()[0]
    words = sizing.size(client, base_url, model, sample, deadline_s, cutoff, auth).words_for(tokens, max_tokens)
    return PromptMaker(words, shared_prefix, seed)


def run_probe(base_url: str, requests: int, concurrency: int = 1, shared_prefix: float = 0.5,
              prompt_words: int | None = 256, max_tokens: int = 16, server: str | None = None,
              seed: int = 0, deadline_s: float = DEFAULT_DEADLINE_S,
              cutoff: Cutoff | None = None, prompt_tokens: int | None = None) -> list[RequestSample]:
    """Send `requests` probe requests, `concurrency` at a time, each bounded by `deadline_s`; prompts of
    `prompt_tokens` tokens (sized with the server's /tokenize and fitted to its slot), else of `prompt_words`.

    Raises httpx.HTTPError / ProbeFailure (a ValueError) when the server cannot be reached or lists no
    model. On KeyboardInterrupt every request in flight is cut off before it propagates.
    """
    base_url = base_url.rstrip("/").removesuffix("/v1")  # "http://host:8000/v1" is how OpenAI clients say it
    name = server or base_url.split("://", 1)[-1]
    cutoff = cutoff or Cutoff()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.Client(limits=limits, trust_env=False)
    try:
        model = model_id(client, base_url, deadline_s, cutoff)
        maker = (sized_maker(client, base_url, model, prompt_tokens, max_tokens, shared_prefix, seed, deadline_s, cutoff)
                 if prompt_tokens is not None else PromptMaker(prompt_words or 1, shared_prefix, seed))

        def one() -> RequestSample:
            return _guarded(lambda: probe_request(client, base_url, model, maker.next()[0], max_tokens, name,
                                                  deadline_s, cutoff), name)

        return _in_daemons([one] * requests, concurrency)
    except BaseException:
        cutoff.cancel()
        raise
    finally:
        client.close()


def _guarded(request: Callable[[], RequestSample], server: str) -> RequestSample:
    """A request whose unexpected exception becomes a failed sample, so no worker thread dies of one."""
    try:
        return request()
    except Exception as err:  # noqa: BLE001 - the world's mistakes end as one failed request
        return RequestSample(ts=time.time(), server=server, ttft_s=None, total_s=None, prompt_tokens=None,
                             cached_tokens=None, ok=False, error=f"{type(err).__name__}: {err}")


class ProbeRunner:
    """Background thread: rounds of `concurrency` probe requests per ready server that is probed.

    A server gets a burst of `[probe] burst_rounds` rounds every `interval_s` (its figures come in), then
    one round every `backoff_interval_s` (they stay fresh at a small cost: the demo llama-server and its
    probe used 22% of a core at a round every 2 s); a new process of it (a restart) gets a new burst.
    Prompts are sized in tokens with the server's /tokenize and fitted to its slot (sizing.py), once per
    server process. Results go to the inbox (and so into the snapshot's `requests` and the store), with the
    server's API key masked in every error text. Whatever a server answers, or whatever goes wrong in a
    round, ends as failed requests of that round: the thread goes on for the rest of the session.
    """

    def __init__(self, supervisor: Supervisor, config: ProbeConfig, inbox: Pushable):
        self._sup = supervisor
        self._cfg = config
        self._inbox = inbox
        self._stop = threading.Event()
        self._cutoff = Cutoff()
        self._thread: threading.Thread | None = None
        self._makers: dict[tuple[str, int | None], PromptMaker] = {}
        self._models: dict[tuple[str, int | None], str] = {}
        self._rounds: dict[tuple[str, int | None], tuple[int, float]] = {}  # rounds done, when the next is due
        self._errors: dict[str, set[str]] = {}  # distinct errors each server's requests failed with

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="gpudash-probe-runner")
            self._thread.start()

    def stop(self) -> None:
        """No new rounds, and the requests of a round in flight are cut off now."""
        self._stop.set()
        self._cutoff.cancel()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_S)
            self._thread = None

    def _run(self) -> None:
        c = self._cfg
        limits = httpx.Limits(max_connections=c.concurrency * 8)
        with httpx.Client(limits=limits, trust_env=False) as client:
            while not self._stop.is_set():
                for st in self._sup.states():
                    key = (st.server, st.pid)
                    done, due = self._rounds.get(key, (0, 0.0))
                    if (st.state is not ServerState.READY or not self._sup.probed(st.server) or self._stop.is_set()
                            or time.monotonic() < due):
                        continue
                    try:
                        self._round(client, st.server, st.pid)
                    except Exception as err:  # noqa: BLE001 - one bad round never ends the probing
                        log.exception("probe round for %s failed", st.server)
                        self._push(self._failure(st.server, f"{type(err).__name__}: {err}"))
                    wait = c.interval_s if done + 1 < c.burst_rounds else max(c.interval_s, c.backoff_interval_s)
                    self._rounds[key] = (done + 1, time.monotonic() + wait)
                self._stop.wait(min(c.interval_s, 1.0))

    def _push(self, sample: RequestSample) -> None:
        """A request row, and for a failure with an error not seen before from that server, one probe.error
        event (45 requests failing with the same HTTP 400 are one event, not 45); the server's key is masked
        before either is made."""
        if sample.error is not None:
            sample = dataclasses.replace(sample, error=mask_values(sample.error, self._secrets(sample.server)))
        self._inbox.push(sample)
        if not sample.ok and sample.error is not None:
            seen = self._errors.setdefault(sample.server, set())
            if sample.error not in seen and len(seen) < MAX_DISTINCT_ERRORS:
                seen.add(sample.error)
                self._inbox.push(Event(ts=sample.ts, actor="probe", kind="probe.error", target=sample.server,
                                       ok=False, reason=sample.error))

    def _secrets(self, server: str) -> tuple[str, ...]:
        """The key the probe sends the server (an error body may echo it), as sent and as set."""
        keys = {v.removeprefix("Bearer ") for v in self._sup.auth(server).values()}
        return tuple(sorted((k for k in keys if len(k) >= 4), key=len, reverse=True))

    def _failure(self, server: str, error: str) -> RequestSample:
        return RequestSample(ts=time.time(), server=server, ttft_s=None, total_s=None, prompt_tokens=None,
                             cached_tokens=None, ok=False, error=error)

    def _round(self, client: httpx.Client, server: str, pid: int | None) -> None:
        base = self._sup.base_url(server)
        if base is None:
            return
        c = self._cfg
        key = (server, pid)
        try:
            auth = self._sup.auth(server)
            model = self._models.get(key) or model_id(client, base, c.timeout_s, self._cutoff, auth)
            self._models[key] = model
            maker = self._makers.get(key) or sized_maker(client, base, model, c.prompt_tokens, c.max_tokens,
                                                         c.shared_prefix, zlib.crc32(server.encode()), c.timeout_s,
                                                         self._cutoff, auth)
            self._makers[key] = maker
        except (httpx.HTTPError, ProbeFailure) as err:
            if not self._stop.is_set():  # requests cut off by stop() measure nothing
                self._push(self._failure(server, f"/v1/models: {err}"))
            return
        jobs = [functools.partial(_guarded, functools.partial(probe_request, client, base, model, maker.next()[0],
                                                              c.max_tokens, server, c.timeout_s, self._cutoff, auth),
                                    server)
                for _ in range(c.concurrency)]
        samples = _in_daemons(jobs, c.concurrency)
        if not self._stop.is_set():
            for sample in samples:
                self._push(sample)
