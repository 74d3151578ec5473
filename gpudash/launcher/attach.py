"""Attached servers: a [[servers]] entry with a `url`, a server someone else runs (systemd, docker,
another host). gpudash reads it and never starts, stops, relaunches or signals it.

Its kind is the entry's, else told from its /metrics families (`llamacpp:`, `vllm:`), else from who owns
its /v1/models. A read runs on the scrape pool in the background and the sampler takes the last one
finished, so a server that hangs never holds a tick. One that stops answering (two reads in a row) is
`unreachable` (a `server.down` event) and is asked a cheap GET /health once a second, so its return is seen within about
two seconds (a `server.up` event, with how long it was gone) without hammering a dead address; an
address that answers as no known kind (`not a server`) is read again after a backoff. An API key comes
from the environment variable the entry names and is masked in every error text.

Where the server runs on this machine, its process is found once (a look through every process's
command line, the costly part) and afterwards only checked to be the same process (its start time); it
is looked for again when that process is gone or the server comes back after an outage.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import psutil

from gpudash.config import ServerSpec
from gpudash.launcher.counters import History, Prev
from gpudash.launcher.discovery import process_at
from gpudash.launcher.kinds import KINDS, kind_named, kind_recognising
from gpudash.launcher.kinds.base import ServerKind
from gpudash.launcher.scrape_http import Scraper, ScrapeError
from gpudash.proctree import descendants
from gpudash.records import Event, ServerSample, ServerState
from gpudash.redact import mask_values

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # reads of an address that answers as no known kind
HEALTH_EVERY_S = 1.0  # GET /health of an unreachable server: its return is seen within about 2 s
PIDS_TTL_S = 5.0  # how long one walk of the local servers' process trees answers `pids`
# What an address that answers as no known kind is, in the error line: "not a llama-server/vLLM".
NOT_A_KIND = f"not a {'/'.join(k.label for k in KINDS.values())}"


class NotAServer(Exception):
    """The address answers, but not as any server kind gpudash knows."""


@dataclass
class _Local:
    """The process an attached server runs as on this machine, and its start time (tells a reused pid)."""

    pid: int
    cmdline: tuple[str, ...]
    started: float


@dataclass
class _Attached:
    spec: ServerSpec
    kind: ServerKind | None
    state: ServerState = ServerState.ATTACHING
    error: str | None = None
    failures: int = 0
    next_try: float = 0.0
    history: History = field(default_factory=History)
    last: ServerSample | None = None
    reading: Future | None = None
    local: _Local | None = None
    looked: bool = False  # whether the local process was looked for since the last reason to look again
    down_since: float | None = None  # when the outage in progress began (wall clock)


def bearer(key: str | None) -> dict[str, str]:
    """The Authorization header for an API key ({} for none)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def _key(spec: ServerSpec) -> str | None:
    """The attached server's API key from the variable its entry names, without the newline a file-fed
    variable often ends with (it would make the header invalid)."""
    key = os.environ.get(spec.api_key_env or "", "").strip() if spec.api_key_env else ""
    return key or None


def headers(spec: ServerSpec) -> dict[str, str]:
    """The Authorization header an attached server's key asks for ({} without `api_key_env`)."""
    return bearer(_key(spec))


def secrets(spec: ServerSpec) -> tuple[str, ...]:
    """The attached server's key, as it is set (a trailing newline too) and as sent: masked in any text."""
    raw = os.environ.get(spec.api_key_env or "") if spec.api_key_env else None
    return tuple(sorted({v for v in (raw, raw.strip() if raw else None) if v}, key=len, reverse=True))


def refusal(spec: ServerSpec, action: str, local: tuple[int, tuple[str, ...]] | None,
            kind: ServerKind | None = None) -> str:
    """The one sentence that refuses an action needing a relaunch of an attached server: why, and where the
    operator changes it instead (its own command line when it runs here)."""
    where = (f"it runs here as pid {local[0]}: `{' '.join(mask_values(w, secrets(spec)) for w in local[1])}`"
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


def _same_process(local: _Local) -> bool:
    """Whether the found process still runs (and is the same one, not a reused pid): one stat read."""
    try:
        return psutil.Process(local.pid).create_time() == local.started
    except (psutil.Error, OSError):
        return False


class AttachedServers:
    """Every attached server of one config: their last reads, and the background reads that refresh them.
    `inbox` (anything with `push`, the app's Inbox) gets each outage's server.down / server.up events."""

    def __init__(self, specs: list[ServerSpec], backoff_s: tuple[float, ...] = BACKOFF_S,
                 inbox: Any = None, health_every_s: float = HEALTH_EVERY_S):
        self._servers = {s.name: _Attached(s, kind_named(s.kind) if s.kind else None) for s in specs if s.attached}
        self._backoff_s = backoff_s
        self._health_every_s = health_every_s
        self._inbox = inbox
        self._lock = threading.Lock()
        self._pids_seen: tuple[float, dict[int, str]] = (-PIDS_TTL_S, {})

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
        """(pid, command line) of the server when it runs on this machine, as the background reads found it
        (never looked up here: callers are every source thread of every tick)."""
        local = self._servers[name].local
        return (local.pid, local.cmdline) if local is not None else None

    def refusal(self, name: str, action: str) -> str:
        a = self._servers[name]
        if not a.looked:
            self._find_local(a)
        return refusal(a.spec, action, self.local(name), a.kind)

    def pids(self) -> dict[int, str]:
        """{pid: server} of attached servers that run here, with their workers (NVML's processes show them;
        a signal from the Processes view is refused for them); one walk of their process trees answers for
        PIDS_TTL_S. A server not looked for yet (no background read has run) is looked for here, once."""
        now = time.monotonic()
        at, found = self._pids_seen
        if now - at < PIDS_TTL_S and all(a.looked for a in self._servers.values()):
            return found
        found = {}
        for name, a in list(self._servers.items()):
            if not a.looked:
                self._find_local(a)
            if a.local is not None:
                found[a.local.pid] = name
                for child in descendants(a.local.pid):
                    found[child] = name
        self._pids_seen = (now, found)
        return found

    def states(self) -> tuple[ServerSample, ...]:
        """Each attached server's last read (or its state before the first one finished); a server that
        does not answer is shown with this moment's time, not that of its last failed read."""
        now = time.time()
        with self._lock:
            return tuple(self._sample(name, a, now) if a.last is None
                         else replace(a.last, ts=now) if not a.state.up else a.last
                         for name, a in self._servers.items())

    def poll(self, http: Scraper, pool: ThreadPoolExecutor) -> tuple[tuple[ServerSample, ...], tuple[str, ...]]:
        """Start a read of each server that is due (none in flight, its wait over); return every server's
        last read and the errors they carry. Never waits for a read."""
        now = time.monotonic()
        with self._lock:
            for name, a in self._servers.items():
                if (a.reading is None or a.reading.done()) and now >= a.next_try:
                    a.reading = pool.submit(self._read, name, http)
        samples = self.states()
        return samples, tuple(f"{s.server}: {s.error}" for s in samples if s.error)

    def _sample(self, name: str, a: _Attached, now: float, **fields: Any) -> ServerSample:
        pid = a.local.pid if a.local is not None else None
        return ServerSample(ts=now, server=name, kind=a.kind.name if a.kind else "unknown", state=a.state,
                            pid=pid, port=urlsplit(str(a.spec.url)).port, origin="attached", error=a.error,
                            url=a.spec.url, **fields)

    def _find_local(self, a: _Attached) -> None:
        """Look for the server's process on this machine (the costly look through every process)."""
        a.looked = True
        found = process_at(str(a.spec.url))
        if found is None:
            a.local = None
            return
        try:
            started = psutil.Process(found[0]).create_time()
        except (psutil.Error, OSError):
            a.local = None
            return
        a.local = _Local(found[0], found[1], started)
        self._pids_seen = (-PIDS_TTL_S, {})

    def _check_local(self, a: _Attached) -> None:
        """The found process, checked cheaply; looked for again when it is gone or was never looked for."""
        if not a.looked or (a.local is not None and not _same_process(a.local)):
            self._find_local(a)

    def _read(self, name: str, http: Scraper) -> None:
        """One background read: kind (first time), /metrics and what else the kind reads; or, while the
        server is unreachable, a GET /health that says whether a whole read is worth it."""
        a = self._servers[name]
        spec, base = a.spec, str(a.spec.url)
        auth = headers(spec)

        def get(path: str) -> tuple[int, bytes]:
            return http.get(base, path, auth)

        if a.state is ServerState.UNREACHABLE:
            try:
                status, _ = get("/health")
            except ScrapeError as err:
                self._failed(name, ServerState.UNREACHABLE, str(err))
                return
            if status != 200:  # loading (llama-server says 503 until its model is in) or refusing
                self._failed(name, ServerState.UNREACHABLE, f"GET /health answered HTTP {status}")
                return
            a.looked = False  # back after an outage: perhaps a new process
        self._check_local(a)
        now = time.time()
        pid = a.local.pid if a.local is not None else None
        try:
            kind = a.kind or self._tell_kind(get)
            fields, values = kind.scrape(get, spec, a.history, pid, now, a.local.cmdline if a.local else None)
        except NotAServer as err:
            self._failed(name, ServerState.NOT_A_SERVER, str(err))
            return
        except (ScrapeError, ValueError, OSError, RecursionError) as err:
            self._failed(name, ServerState.UNREACHABLE, str(err) or type(err).__name__)
            return
        with self._lock:
            was, down_since = a.state, a.down_since
            a.history.add(Prev(pid, now, values))
            a.kind, a.failures, a.next_try, a.error, a.down_since = kind, 0, 0.0, None, None
            a.state = ServerState(fields.pop("state", ServerState.READY))
            a.last = self._sample(name, a, now, **{k: v for k, v in fields.items() if v is not None})
        if was is ServerState.UNREACHABLE:
            self._event("server.up", name, ok=True, old=ServerState.UNREACHABLE, new=a.state,
                        reason=f"answers again after {now - (down_since or now):.1f} s" + (
                            f" as pid {pid}" if pid is not None else ""))

    def _tell_kind(self, get: Any) -> ServerKind:
        """The kind of an attached server from its /metrics families, else from its /v1/models owner."""
        status, body = get("/metrics")
        if status in (401, 403):
            raise ScrapeError(f"GET /metrics answered HTTP {status}: the server wants an API key; name the "
                              "environment variable that holds it in the entry's api_key_env (or check its value)")
        if status == 200:
            found = kind_recognising(body.decode("utf-8", "replace"))
            if found is not None:
                return found
        models_status, body = get("/v1/models")
        try:
            data = json.loads(body).get("data", []) if models_status == 200 else []
            owners = {str(m.get("owned_by")) for m in data}
        except (ValueError, AttributeError, TypeError, RecursionError):
            owners = set()
        for k in KINDS.values():
            if k.models_owner in owners:
                return k
        raise NotAServer(f"its /metrics has no {' or '.join(k.metric_prefix for k in KINDS.values())} families "
                         f"and its /v1/models names no known owner (GET /metrics: HTTP {status}, GET /v1/models: HTTP "
                         f"{models_status})")

    def _failed(self, name: str, state: ServerState, error: str) -> None:
        """A read failed. A server that was up is read again at once before it is called unreachable: one
        read past its deadline on a loaded box is no outage (it wrote server.down / server.up pairs)."""
        a = self._servers[name]
        said = NOT_A_KIND if state is ServerState.NOT_A_SERVER else state
        now = time.time()
        with self._lock:
            if a.state.up and a.failures == 0:
                a.failures, a.next_try = 1, 0.0
                return
            was = a.state
            a.error = mask_values(f"{said}: {error}", secrets(a.spec))
            a.state = state
            wait = (self._health_every_s if state is ServerState.UNREACHABLE
                    else self._backoff_s[min(a.failures, len(self._backoff_s) - 1)])
            a.next_try = time.monotonic() + wait
            a.failures += 1
            a.history.clear()
            a.last = self._sample(name, a, now)
            if state is ServerState.UNREACHABLE and was is not ServerState.UNREACHABLE:
                a.down_since = now
        if state is ServerState.UNREACHABLE and was is not ServerState.UNREACHABLE:
            self._event("server.down", name, ok=False, old=was, new=state, reason=a.error)

    def _event(self, kind: str, name: str, **fields: Any) -> None:
        if self._inbox is not None:
            self._inbox.push(Event(ts=time.time(), actor="attach", kind=kind, target=name, **fields))
