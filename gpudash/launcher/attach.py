"""Attached servers: a [[servers]] entry with a `url`, a server someone else runs (systemd, docker,
another host). gpudash reads it and never starts, stops, relaunches or signals it.

Its kind is the entry's, else told from its /metrics families (`llamacpp:`, `vllm:`), else from who owns
its /v1/models. A read runs on the scrape pool in the background and the sampler takes the last one
finished, so a server that hangs never holds a tick; one that fails is read again after a backoff, and
shows `unreachable` (or `not a server`) with the last error. An API key comes from the
environment variable the entry names and is masked in every error text.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpudash.config import ServerSpec
from gpudash.launcher.counters import Prev, families
from gpudash.launcher.discovery import process_at
from gpudash.launcher.kinds import KINDS, kind_named, kind_recognising
from gpudash.launcher.kinds.base import ServerKind
from gpudash.launcher.scrape_http import Scraper, ScrapeError
from gpudash.proctree import descendants
from gpudash.records import ServerSample, ServerState
from gpudash.redact import mask_values

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
# What an address that answers as no known kind is, in the error line: "not a llama-server/vLLM".
NOT_A_KIND = f"not a {'/'.join(k.label for k in KINDS.values())}"


class NotAServer(Exception):
    """The address answers, but not as any server kind gpudash knows."""


@dataclass
class _Attached:
    spec: ServerSpec
    kind: ServerKind | None
    state: ServerState = ServerState.ATTACHING
    error: str | None = None
    failures: int = 0
    next_try: float = 0.0
    prev: Prev | None = None
    last: ServerSample | None = None
    reading: Future | None = None
    local: tuple[int, tuple[str, ...]] | None = None
    local_checked: float = field(default=-1e9)


def headers(spec: ServerSpec) -> dict[str, str]:
    """The Authorization header an attached server's key asks for ({} without `api_key_env`)."""
    key = os.environ.get(spec.api_key_env or "") if spec.api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def refusal(spec: ServerSpec, action: str, local: tuple[int, tuple[str, ...]] | None,
            kind: ServerKind | None = None) -> str:
    """The one sentence that refuses an action needing a relaunch of an attached server: why, and where the
    operator changes it instead (its own command line when it runs here)."""
    where = (f"it runs here as pid {local[0]}: `{' '.join(mask_values(w, _secrets(spec)) for w in local[1])}`"
             if local is not None else f"it runs at {spec.url}, started by something else")
    if action in ("start", "stop", "restart", "sleep", "wake"):
        todo = f"{action} it where it is run (its systemd unit, docker, ...)"
    else:
        todo = f"change {_flag(kind, action) or action} in that command line and restart it yourself"
    return f"{spec.name} is attached, so gpudash only reads it and never restarts or signals it; {where}; {todo}"


def _flag(kind: ServerKind | None, action: str) -> str | None:
    """The flag an operator changes for `action`, as the server's kind spells it (None: not known)."""
    if action == "preload":
        return "LD_PRELOAD (engine = \"preload\")"
    return kind.flag_for(action) if kind is not None else None


def _secrets(spec: ServerSpec) -> tuple[str, ...]:
    key = os.environ.get(spec.api_key_env or "") if spec.api_key_env else None
    return (key,) if key else ()


class AttachedServers:
    """Every attached server of one config: their last reads, and the background reads that refresh them."""

    def __init__(self, specs: list[ServerSpec], backoff_s: tuple[float, ...] = BACKOFF_S):
        self._servers = {s.name: _Attached(s, kind_named(s.kind) if s.kind else None) for s in specs if s.attached}
        self._backoff_s = backoff_s
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return list(self._servers)

    def add(self, spec: ServerSpec) -> None:
        """Attach one more server for this run (a found one, from the Servers view)."""
        with self._lock:
            self._servers[spec.name] = _Attached(spec, kind_named(spec.kind) if spec.kind else None)

    def __contains__(self, name: object) -> bool:
        return name in self._servers

    def spec(self, name: str) -> ServerSpec:
        return self._servers[name].spec

    def kind(self, name: str) -> str | None:
        """The kind an attached server turned out to be (None until known)."""
        k = self._servers[name].kind
        return k.name if k is not None else None

    def base_url(self, name: str) -> str:
        return str(self._servers[name].spec.url)

    def local(self, name: str) -> tuple[int, tuple[str, ...]] | None:
        """(pid, command line) of the server when it runs on this machine (looked up at most every 5 s)."""
        a = self._servers[name]
        now = time.monotonic()
        if now - a.local_checked >= 5.0:
            a.local, a.local_checked = process_at(str(a.spec.url)), now
        return a.local

    def refusal(self, name: str, action: str) -> str:
        return refusal(self._servers[name].spec, action, self.local(name), self._servers[name].kind)

    def pids(self) -> dict[int, str]:
        """{pid: server} of attached servers that run here, with their workers (NVML's processes show them)."""
        out: dict[int, str] = {}
        for name in self._servers:
            local = self.local(name)  # looked up here too: the first background read may not have run yet
            if local is not None:
                out[local[0]] = name
                for child in descendants(local[0]):
                    out[child] = name
        return out

    def states(self) -> tuple[ServerSample, ...]:
        """Each attached server's last read (or its state before the first one finished)."""
        now = time.time()
        with self._lock:
            return tuple(a.last if a.last is not None else self._sample(name, a, now)
                         for name, a in self._servers.items())

    def poll(self, http: Scraper, pool: ThreadPoolExecutor) -> tuple[tuple[ServerSample, ...], tuple[str, ...]]:
        """Start a read of each server that is due (none in flight, backoff over); return every server's
        last read and the errors they carry. Never waits for a read."""
        now = time.monotonic()
        with self._lock:
            for name, a in self._servers.items():
                if (a.reading is None or a.reading.done()) and now >= a.next_try:
                    a.reading = pool.submit(self._read, name, http)
        samples = self.states()
        return samples, tuple(f"{s.server}: {s.error}" for s in samples if s.error)

    def _sample(self, name: str, a: _Attached, now: float, **fields: Any) -> ServerSample:
        local = a.local[0] if a.local is not None else None
        return ServerSample(ts=now, server=name, kind=a.kind.name if a.kind else "unknown", state=a.state,
                            pid=local, origin="attached", error=a.error, url=a.spec.url, **fields)

    def _read(self, name: str, http: Scraper) -> None:
        """One background read: kind (first time), /metrics and what else the kind reads; state and backoff."""
        a = self._servers[name]
        spec, base = a.spec, str(a.spec.url)
        auth = headers(spec)
        self.local(name)

        def get(path: str) -> tuple[int, bytes]:
            return http.get(base, path, auth)

        now = time.time()
        try:
            kind = a.kind or self._tell_kind(get)
            pid = a.local[0] if a.local is not None else None
            fields, values = kind.scrape(get, spec, a.prev, pid, now)
        except NotAServer as err:
            self._failed(name, ServerState.NOT_A_SERVER, str(err))
            return
        except (ScrapeError, ValueError, OSError) as err:
            self._failed(name, ServerState.UNREACHABLE, str(err) or type(err).__name__)
            return
        with self._lock:
            a.kind, a.prev, a.failures, a.next_try, a.error = kind, Prev(pid, now, values), 0, 0.0, None
            a.state = ServerState(fields.pop("state", ServerState.READY))
            a.last = self._sample(name, a, now, **{k: v for k, v in fields.items() if v is not None})

    def _tell_kind(self, get: Any) -> ServerKind:
        """The kind of an attached server from its /metrics families, else from its /v1/models owner."""
        status, body = get("/metrics")
        if status in (401, 403):
            raise ScrapeError(f"GET /metrics answered HTTP {status}: the server wants an API key; name the "
                              "environment variable that holds it in the entry's api_key_env (or check its value)")
        if status == 200:
            try:
                found = kind_recognising(families(body.decode("utf-8", "replace")))
            except ValueError:
                found = None
            if found is not None:
                return found
        models_status, body = get("/v1/models")
        try:
            data = json.loads(body).get("data", []) if models_status == 200 else []
            owners = {str(m.get("owned_by")) for m in data}
        except (ValueError, AttributeError, TypeError):
            owners = set()
        for k in KINDS.values():
            if k.models_owner in owners:
                return k
        raise NotAServer(f"its /metrics has no {' or '.join(k.metric_prefix for k in KINDS.values())} families "
                         f"and its /v1/models names no known owner (GET /metrics: HTTP {status}, GET /v1/models: HTTP "
                         f"{models_status})")

    def _failed(self, name: str, state: ServerState, error: str) -> None:
        a = self._servers[name]
        said = NOT_A_KIND if state is ServerState.NOT_A_SERVER else state
        with self._lock:
            a.error = mask_values(f"{said}: {error}", _secrets(a.spec))
            a.state = state
            a.next_try = time.monotonic() + self._backoff_s[min(a.failures, len(self._backoff_s) - 1)]
            a.failures += 1
            a.prev = None
            a.last = self._sample(name, a, time.time())
