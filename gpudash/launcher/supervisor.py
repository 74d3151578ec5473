"""Starting, watching, restarting and stopping inference servers.

Servers start one after another, each only once the previous one is healthy (concurrent vLLM starts race
for GPU memory). Every server runs in its own process group so stopping it (SIGTERM, then SIGKILL) takes
its workers along, and is taken down (SIGTERM, then SIGKILL) should gpudash die without stopping it
(guard.py). A stop wins over a start in progress: the health wait ends as soon as the stop is asked for.
A waiter thread per process notices a crash the moment the process exits and restarts it with backoff;
every start, ready, crash, restart and stop is pushed to the inbox as an Event.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from gpudash.engine.errors import EngineError
from gpudash.preload.env import preload_env
from gpudash.config import ServerSpec
from gpudash.launcher import argv as argv_mod
from gpudash.launcher.binary import binary_flags, resolve_binary
from gpudash.launcher.attach import AttachedServers, bearer, headers as attach_headers
from gpudash.launcher.probe.cache_kinds import RESTORE_EVENT
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.guard import guarded
from gpudash.launcher.health import NotHealthy, free_port, port_free, url_host, wait_healthy
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.logparse import LogFacts, parse_line
from gpudash.launcher.server_logs import (DEFAULT_MAX_BYTES, LogDirError, RotatingLog, header_line, instance_log,
                                         open_log, point_latest, prune_old)
from gpudash.launcher.sleep import Action, SleepError, SleepResult
from gpudash.proctree import descendants, end_tagged, tagged_env
from gpudash.records import Event, ServerSample, ServerState
from gpudash.redact import mask_values, redact_args, redact_spec, secret_values

TAIL_LINES = 2000
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
# A run that stayed up this long resets the backoff (the next crash waits the shortest time again).
STABLE_S = 60.0
# How long one walk of the servers' process trees answers `pids`: longer than a tick, so the sources of
# several ticks share it (a llama-server's walk reads ~30 threads' children files); a server that starts
# or stops is seen at once, a vLLM worker it spawns within this time.
PIDS_TTL_S = 5.0


# States in which a launched server's process is its own (not exited, not waiting to be started again).
_HAS_PROCESS = (ServerState.LOADING, ServerState.RELAUNCHING, ServerState.READY, ServerState.SLEEPING)


class Pushable(Protocol):
    """Where events and request rows go: the app's one Inbox (anything with `push`)."""

    def push(self, record: Any) -> None: ...


@dataclass
class _Server:
    spec: ServerSpec
    log_path: Path
    log_made: bool = False  # this instance created log_path (later launches append to it)
    port: int | None = None
    proc: subprocess.Popen | None = None
    state: ServerState = ServerState.STOPPED
    started: float | None = None
    restarts: int = 0  # after a crash
    relaunches: int = 0  # asked for (restart(), e.g. a new split)
    crashes_in_row: int = 0
    facts: LogFacts = LogFacts()
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)  # one start/stop/restart at a time
    cancel: threading.Event = field(default_factory=threading.Event)  # set by stop: no more auto-restarts


def _spec_dict(spec: ServerSpec) -> dict[str, Any]:
    """A spec as recorded in events: non-default fields, secret env values and flags masked."""
    return redact_spec(spec.model_dump(mode="json", exclude_defaults=True))


class Supervisor:
    """Owns the server processes; thread-safe; the TUI's control layer and `gpudash serve` drive it."""

    def __init__(self, specs: list[ServerSpec], inbox: Pushable, log_dir: Path,
                 stop_timeout_s: float = 10.0, backoff_s: tuple[float, ...] = BACKOFF_S,
                 gpu_memory: Callable[[], dict[int, int]] | None = None, preload_knobs: dict[str, Any] | None = None,
                 log_max_bytes: int = DEFAULT_MAX_BYTES):
        """`gpu_memory` returns {gpu index: total bytes} of the real GPUs; with it, a llama.cpp server
        with a `share` gets the -ngl/-c that keep it inside that share (llama.cpp has no share flag).
        `preload_knobs`: start-up knobs of servers with engine = "preload" (gpudash.preload.knobs.file_knobs).
        `log_max_bytes`: the size at which a server's log rotates ([logs] server_max_bytes)."""
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"server names must be unique, got {names}")
        self.attached = AttachedServers(specs, inbox=inbox)  # only read, never run: launcher/attach.py
        self._inbox = inbox
        self._log_dir = Path(log_dir)
        self._log_max_bytes = log_max_bytes
        self._stop_timeout_s = stop_timeout_s
        self._backoff_s = backoff_s
        self._gpu_memory = gpu_memory
        self.preload_knobs = dict(preload_knobs or {})  # what the next start of a preloaded server gets
        self._lock = threading.Lock()  # guards the dict and the fields the waiter threads change
        self._stopping: weakref.WeakSet[subprocess.Popen] = weakref.WeakSet()  # exits that are no crash
        self._tags: weakref.WeakKeyDictionary[subprocess.Popen, str] = weakref.WeakKeyDictionary()  # proctree
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpudash-spawn")
        self._pids_seen: tuple[float, tuple[tuple[str, int], ...], dict[int, str]] = (0.0, (), {})
        self._servers: dict[str, _Server] = {
            s.name: _Server(s, instance_log(self._log_dir, s.name)) for s in specs if not s.attached
        }

    # ---- queries -------------------------------------------------------------------------------------

    def specs(self) -> dict[str, ServerSpec]:
        """Each server's current spec, with the port it runs (or last ran) on filled in."""
        with self._lock:
            specs = {n: (s.spec if s.port is None else s.spec.model_copy(update={"port": s.port}))
                     for n, s in self._servers.items()}
        for n in self.attached.names():  # with the kind it turned out to be
            spec, kind = self.attached.spec(n), self.attached.kind(n)
            specs[n] = spec if spec.kind or kind is None else spec.model_copy(update={"kind": kind})
        return specs

    def base_url(self, name: str) -> str | None:
        """http://host:port of a server once it has a port, else None."""
        if name in self.attached:
            return self.attached.base_url(name)
        with self._lock:
            s = self._get(name)
            return None if s.port is None else f"http://{url_host(s.spec.host)}:{s.port}"

    def pids(self) -> dict[int, str]:
        """{pid: server} for every running server process and its descendants (vLLM workers)."""
        with self._lock:
            running = tuple((n, s.proc.pid) for n, s in self._servers.items()
                            if s.proc is not None and s.proc.poll() is None)
        # Several sources ask each tick: one walk of the trees serves them all for PIDS_TTL_S, unless a
        # server started or stopped meanwhile.
        now = time.monotonic()
        at, roots, found = self._pids_seen
        if roots != running or now - at >= PIDS_TTL_S:
            found = {}
            for name, pid in running:
                found[pid] = name
                for child in descendants(pid):
                    found[child] = name
            self._pids_seen = (now, running, found)
        return {**self.attached.pids(), **found}

    def attach(self, spec: ServerSpec) -> None:
        """Read one more server for the rest of this run (a `url` spec: a found server attached with one
        key); LaunchError when its name is taken."""
        if not spec.attached:
            raise LaunchError(spec.name, "only a server with a `url` can be attached")
        if spec.name in self._servers or spec.name in self.attached:
            raise LaunchError(spec.name, "a server of that name is configured already; pick another name")
        self.attached.add(spec)

    def refusal(self, name: str, action: str) -> str | None:
        """The sentence refusing `action` ("split", "share", "stop", a spec field, ...) on an attached
        server; None for a server gpudash runs."""
        return self.attached.refusal(name, action) if name in self.attached else None

    def probed(self, name: str) -> bool:
        """Whether the probe workload goes to this server (its `probe`; unset: launched yes, attached no)."""
        spec = self.attached.spec(name) if name in self.attached else self._get(name).spec
        return spec.probe if spec.probe is not None else not spec.attached

    def auth(self, name: str) -> dict[str, str]:
        """Headers a request to the server needs: an attached server's API key, or the one a launched server
        was started with (`--api-key` in its extra_args)."""
        if name in self.attached:
            return attach_headers(self.attached.spec(name))
        spec = self._get(name).spec
        return bearer(kind_of(spec).api_key(spec))

    def log_tail(self, name: str, n: int = 200) -> list[str]:
        if name in self.attached:  # its log is wherever its own supervisor keeps it
            return []
        with self._lock:
            tail = list(self._get(name).tail)
        return tail[-n:] if n > 0 else []

    def log_path(self, name: str) -> Path | None:
        """The server's log file; None for an attached server (whoever runs it keeps its log)."""
        return None if name in self.attached else self._get(name).log_path

    def states(self) -> tuple[ServerSample, ...]:
        """Process state of every launched server (no /metrics; ServerSource adds those), then each
        attached server's last read."""
        now = time.time()
        with self._lock:
            return self._managed_states(now) + self.attached.states()

    def _managed_states(self, now: float) -> tuple[ServerSample, ...]:
        return tuple(
            ServerSample(ts=now, server=n, kind=str(s.spec.kind), state=s.state,
                         pid=s.proc.pid if s.proc is not None and s.state in _HAS_PROCESS else None,
                         port=s.port, uptime_s=(now - s.started) if s.started and s.state is ServerState.READY else None,
                         restarts=s.restarts, relaunches=s.relaunches,
                         draft_acceptance=s.facts.draft_acceptance)
            for n, s in self._servers.items())

    def _get(self, name: str, action: str | None = None) -> _Server:
        """The launched server `name`; LaunchError for an attached one (refusing `action` in one sentence)
        or an unknown name."""
        if name in self.attached:
            raise LaunchError(name, self.attached.refusal(name, action or "restart"))
        try:
            return self._servers[name]
        except KeyError:
            known = [*self._servers, *self.attached.names()]
            raise LaunchError(name, f"no such server; configured: {', '.join(known) or 'none'}") from None

    # ---- actions -------------------------------------------------------------------------------------

    def start_all(self) -> None:
        """Start every stopped server in order, each after the previous is healthy; stops at the first failure."""
        for name in list(self._servers):
            self.start(name)

    def start(self, name: str) -> None:
        """Start one server (no-op if it runs) and wait until it is healthy; LaunchError if it cannot."""
        srv = self._get(name, "start")
        with srv.lock:
            if srv.proc is not None and srv.proc.poll() is None:
                return
            srv.cancel.clear()
            self._launch(srv, srv.spec, actor_kind="server.start")

    def stop(self, name: str) -> None:
        """Stop one server: SIGTERM to its process group, SIGKILL after the timeout; records server.stop."""
        srv = self._get(name, "stop")
        srv.cancel.set()
        with srv.lock:
            was = srv.state
            self._terminate(srv)
            with self._lock:
                srv.state = ServerState.STOPPED
                srv.started = None
        if was is not ServerState.STOPPED:
            self._event("server.stop", name, old=was, new=ServerState.STOPPED)

    def stop_all(self) -> None:
        """Stop every server, last started first; no process is left behind."""
        for name in reversed(list(self._servers)):
            self.stop(name)

    def restart(self, name: str, new_spec: ServerSpec | None = None) -> None:
        """Restart a server, optionally with a new spec (checked before the old process is touched).

        If the new spec fails to come up, the previous spec is started again and LaunchError says both.
        """
        srv = self._get(name, _relaunch_action(self.attached.spec(name), new_spec) if name in self.attached else None)
        if new_spec is not None and new_spec.name != name:
            raise LaunchError(name, f"the new spec is named '{new_spec.name}'; a restart keeps the name")
        with srv.lock:
            old_spec = srv.spec
            spec = new_spec or old_spec
            own_port = srv.port if srv.proc is not None and srv.proc.poll() is None else None
            self._prepare(spec, reuse_port=own_port)  # bad spec: raise now, old server untouched
            srv.cancel.set()
            with self._lock:
                srv.state, srv.started = ServerState.RELAUNCHING, None
            self._terminate(srv)
            srv.cancel.clear()
            try:
                self._launch(srv, spec, actor_kind="server.restart", old=_spec_dict(old_spec), relaunch=True)
            except LaunchError as err:
                if spec is old_spec or own_port is None:  # nothing ran before: nothing to go back to
                    raise
                try:
                    self._launch(srv, old_spec, actor_kind="server.restart", relaunch=True)
                except LaunchError as err2:
                    raise LaunchError(name, f"{err.cause}; restarting with the previous settings failed too: "
                                            f"{err2.cause}") from None
                raise LaunchError(name, f"{err.cause}; it runs again with its previous settings") from None

    def sleep(self, name: str, level: int = 1) -> SleepResult:
        """Put a server's engine to sleep at a level its kind serves (vLLM 1: weights to host memory;
        2: dropped), timed."""
        return self._sleep_or_wake(name, "sleep", level)

    def wake(self, name: str) -> SleepResult:
        """Wake a sleeping server, timed (the model-switching cost)."""
        return self._sleep_or_wake(name, "wake", 1)

    # ---- internals -----------------------------------------------------------------------------------

    def _sleep_or_wake(self, name: str, action: Action, level: int) -> SleepResult:
        """POST /sleep or /wake_up; a server.sleep / server.wake event carries the seconds it took."""
        srv = self._get(name, action)
        with srv.lock:  # read what the call needs; the HTTP call itself runs unlocked so a stop never waits on it
            problem = kind_of(srv.spec).sleep_problem(srv.spec, level if action == "sleep" else None)
            if problem:
                raise LaunchError(name, problem)
            if not srv.state.up:
                raise LaunchError(name, f"it is {srv.state}, not running; start it first")
            was, proc, url = srv.state, srv.proc, f"http://{url_host(srv.spec.host)}:{srv.port}"
        try:
            kind = kind_of(srv.spec)
            res = kind.sleep(url, level) if action == "sleep" else kind.wake(url)
        except SleepError as err:
            self._event(f"server.{action}", name, old=was, ok=False, reason=str(err))
            raise LaunchError(name, str(err)) from None
        with srv.lock, self._lock:
            if srv.proc is not proc:  # stopped or relaunched meanwhile: its new state stands
                raise LaunchError(name, f"it was stopped or relaunched during the {action}")
            srv.state = ServerState.SLEEPING if action == "sleep" else ServerState.READY
        self._event(f"server.{action}", name, old=was,
                    new={"state": srv.state, "seconds": round(res.seconds, 4), "level": res.level})
        return res

    def _peers(self, spec: ServerSpec) -> list[ServerSpec]:
        """All servers' specs as they will be once `spec` runs (for the shared-GPU count)."""
        with self._lock:
            return [spec if n == spec.name else s.spec for n, s in self._servers.items()]

    def _prepare(self, spec: ServerSpec, reuse_port: int | None) -> tuple[argv_mod.Command, int]:
        """Everything checkable before a process exists: GPUs, binary, model files, port, flags."""
        self._check_gpus(spec)
        binary = resolve_binary(spec)
        kind = kind_of(spec)
        for label, model in kind.model_files(spec):
            if not Path(model).expanduser().exists():
                raise LaunchError(spec.name, f"{label} file '{model}' does not exist; fix `{label}` in its "
                                             "[[servers]] entry or run `gpudash demo-model` to make a test model")
        if spec.port is not None:
            port = spec.port
            if port != reuse_port and not port_free(spec.host, port):
                raise LaunchError(spec.name, f"port {port} on {spec.host} is already in use; stop what holds it "
                                             "or set another `port` (or none, to pick a free one)")
        elif reuse_port is not None:
            port = reuse_port
        else:
            port = free_port(spec.host)
        try:
            supported = binary_flags(kind, binary).supported()
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as err:
            raise LaunchError(spec.name, f"could not read the flags of '{binary}' from its --help ({err}); "
                                         "check that it is a working llama-server or vllm") from None
        spec = self._within_share(spec)
        try:
            cmd = argv_mod.build_command(spec, binary, port, self._peers(spec), supported)
        except argv_mod.MissingFlag as err:
            opt = err.option
            raise LaunchError(spec.name, f"'{binary}' has no {' / '.join(opt.spellings)} flag, which `{opt.field}` "
                                         "needs; update the server binary or remove that setting") from None
        if spec.engine == "preload":  # the environment `gpudash run` gives a program
            try:
                cmd = replace(cmd, env=preload_env({**os.environ, **cmd.env}, spec.name, self.preload_knobs))
            except EngineError as err:
                raise LaunchError(spec.name, f'{err}; or set engine = "none" in its [[servers]] entry') from None
        return cmd, port

    def _check_gpus(self, spec: ServerSpec) -> None:
        """The server's GPUs exist on this box and its split has one ratio per GPU it runs on: what the
        config alone cannot know (skipped where the GPUs are unknown, as on a sim rig)."""
        known = sorted(self._gpu_memory()) if self._gpu_memory is not None else []
        if not known:
            return
        missing = [g for g in spec.gpus if g not in known]
        if missing:
            raise LaunchError(spec.name, f"`gpus` names GPU {', '.join(map(str, missing))} but this box has GPU "
                                         f"{', '.join(map(str, known))}; fix `gpus` in its [[servers]] entry")
        ratios = spec.split_ratios()
        problem = spec.split_problem(ratios, spec.gpus or known) if ratios is not None else None
        if problem:
            raise LaunchError(spec.name, problem)

    def _within_share(self, spec: ServerSpec) -> ServerSpec:
        """The spec to run: its kind's flags for its share of the real GPUs (llama.cpp: -ngl/-c)."""
        totals = self._gpu_memory() if self._gpu_memory is not None else {}
        try:
            fitted, budget = kind_of(spec).fitted(spec, totals)
        except ValueError as err:
            raise LaunchError(spec.name, str(err)) from None
        if budget is not None:
            self._event("server.budget", spec.name, new=list(budget.argv), reason=budget.note)
        return fitted

    def _launch(self, srv: _Server, spec: ServerSpec, actor_kind: str, old: Any = None,
                relaunch: bool = False) -> None:
        """Start `spec` for `srv` and wait for health; on any failure nothing of it is left running. A
        "server.restart" that comes up counts in `relaunches` when asked for (`relaunch`, also a fall-back
        to the previous settings), else in `restarts` (after a crash); a relaunch shows as "relaunching"."""
        name = spec.name
        try:
            cmd, port = self._prepare(spec, reuse_port=srv.port if spec.port is None else None)
        except LaunchError as err:
            self._not_relaunching(srv)
            self._event(actor_kind, name, old=old, new=_spec_dict(spec), ok=False, reason=err.cause)
            raise
        try:
            srv.log_path, log = open_log(self._log_dir, name, srv.log_path, srv.log_made)
        except OSError as err:
            self._not_relaunching(srv)
            cause = str(err) if isinstance(err, LogDirError) else f"cannot write its log {srv.log_path}: {err}"
            self._event(actor_kind, name, old=old, new=_spec_dict(spec), ok=False, reason=cause)
            raise LaunchError(name, cause) from None
        srv.log_made = True
        log = RotatingLog(self._log_dir, name, srv.log_path, log, self._log_max_bytes)
        log.write(header_line(' '.join(redact_args(cmd.argv))))  # the header first: pruning counts only
        point_latest(srv.log_path, name)
        prune_old(self._log_dir, name)
        env, tag = tagged_env({**os.environ, **cmd.env})  # finds its children even if they leave its group
        try:
            # Spawned from the one long-lived spawner thread: the death signal (guard.py) follows that thread.
            proc = self._spawner.submit(
                subprocess.Popen, guarded(cmd.argv, self._stop_timeout_s), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=env, start_new_session=True, text=True,
                errors="replace", bufsize=1).result()
        except OSError as err:
            log.close()
            self._not_relaunching(srv)
            cause = f"could not execute '{cmd.argv[0]}': {err.strerror}"
            self._event(actor_kind, name, old=old, new=_spec_dict(spec), ok=False, reason=cause)
            raise LaunchError(name, cause) from None
        self._tags[proc] = tag
        with self._lock:  # a new tail: the old process's last lines (its reader may still run) stay in the old one
            srv.spec, srv.port, srv.proc, srv.tail = spec, port, proc, deque(maxlen=TAIL_LINES)
            srv.state, srv.started, srv.facts = (ServerState.RELAUNCHING if relaunch else ServerState.LOADING), None, LogFacts()
        self._event(actor_kind, name, old=old, new=_spec_dict(spec))
        secrets = secret_values(cmd.env, cmd.argv)
        srv.reader = threading.Thread(target=self._read_log, args=(srv, proc, log, secrets, srv.tail), daemon=True,
                                      name=f"gpudash-log-{name}")
        srv.reader.start()
        url = f"http://{url_host(spec.host)}:{port}/health"
        try:
            ready_ts = wait_healthy(proc, url, spec.health_timeout_s, cancel=srv.cancel, port=port)
        except NotHealthy as err:
            self._terminate(srv)
            if srv.cancel.is_set():  # a stop won the race with the start: no failure to report
                with self._lock:
                    srv.state = ServerState.STOPPED
                raise LaunchError(name, "was stopped while loading") from None
            last = next((ln for ln in reversed(srv.tail) if ln.strip() and not ln.startswith("===")), "")
            with self._lock:
                srv.state = ServerState.CRASHED if err.exit_code is not None else ServerState.STOPPED
            cause = f"{err}" + (f"; its log ends with: {last.strip()[:200]}" if last else "")
            cause += f" (full log: {srv.log_path})"
            self._event("server.fail", name, new=_spec_dict(spec), ok=False, reason=cause)
            raise LaunchError(name, cause) from None
        with self._lock:  # counted with the state change: whoever sees "ready" sees the count too
            srv.state, srv.started = ServerState.READY, ready_ts
            srv.relaunches += relaunch
            srv.restarts += actor_kind == "server.restart" and not relaunch
        address = f"{url_host(spec.host)}:{port}"
        build = kind_of(spec).ready_note(f"http://{address}")
        self._event("server.ready", name, new=address if build is None else f"{address} ({build})", ts=ready_ts)
        threading.Thread(target=self._wait_exit, args=(srv, proc), daemon=True, name=f"gpudash-wait-{name}").start()

    def _not_relaunching(self, srv: _Server) -> None:
        """A relaunch that failed before its process started: the old one is gone, so it is stopped."""
        with self._lock:
            if srv.state is ServerState.RELAUNCHING:
                srv.state = ServerState.STOPPED

    def _read_log(self, srv: _Server, proc: subprocess.Popen, log: RotatingLog, secrets: tuple[str, ...],
                  tail: deque) -> None:
        """Reader thread: copy the server's output to its log file and tail, its secrets masked (a server
        may print its own arguments); it owns (and closes) the file."""
        assert proc.stdout is not None
        with log:
            for line in proc.stdout:
                line = mask_values(line, secrets)
                log.write(line)
                if log.path != srv.log_path:  # rotated into a fresh name (the usual one was taken)
                    with self._lock:
                        srv.log_path = log.path
                with self._lock:
                    tail.append(line.rstrip("\n"))
                    restores, warnings = srv.facts.cache_restores, len(srv.facts.warnings)
                    srv.facts = parse_line(line, srv.facts)
                    restored = srv.facts.cache_restores > restores
                    warned = len(srv.facts.warnings) > warnings
                if restored:  # tells restores from in-slot hits (probe/cache_kinds.py)
                    self._event(RESTORE_EVENT, srv.spec.name, new=line.strip()[:200])
                if warned:  # e.g. a CPU build told to split over GPUs (logparse.py)
                    self._event("server.warning", srv.spec.name, new=srv.facts.warnings[-1])
        proc.stdout.close()

    def _wait_exit(self, srv: _Server, proc: subprocess.Popen) -> None:
        """Waiter thread: a ready server's process exited. Unless it was asked to stop, that is a crash."""
        rc = proc.wait()
        if srv.cancel.is_set() or proc in self._stopping:
            return
        self._stopping.add(proc)
        _killpg(proc.pid, signal.SIGKILL)  # its group's stragglers, now, while the group id is surely its own
        end_tagged(self._tags.get(proc, ""))  # and children that left the group
        with self._lock:
            if srv.proc is not proc:
                return
            uptime = time.time() - (srv.started or time.time())
            srv.state = ServerState.CRASHED
            srv.crashes_in_row = 0 if uptime >= STABLE_S else srv.crashes_in_row
            delay = self._backoff_s[min(srv.crashes_in_row, len(self._backoff_s) - 1)]
            srv.crashes_in_row += 1
        self._event("server.crash", srv.spec.name, old=ServerState.READY, new=f"exit code {rc}", ok=False,
                    reason=f"exited with code {rc} after {uptime:.1f} s")
        if srv.spec.restart_on_crash:
            self._restart_after_crash(srv, proc, delay)

    def _restart_after_crash(self, srv: _Server, dead: subprocess.Popen, delay: float) -> None:
        while True:
            with self._lock:
                srv.state = ServerState.BACKOFF
            if srv.cancel.wait(delay):
                return
            with srv.lock:
                if srv.cancel.is_set() or srv.proc is not dead:
                    return
                try:
                    self._launch(srv, srv.spec, actor_kind="server.restart", old=ServerState.CRASHED)
                except LaunchError:
                    with self._lock:
                        delay = self._backoff_s[min(srv.crashes_in_row, len(self._backoff_s) - 1)]
                        srv.crashes_in_row += 1
                        dead = srv.proc
                    continue
                return

    def _terminate(self, srv: _Server) -> None:
        """SIGTERM the server's process group, SIGKILL after the timeout, then kill any straggler in it.

        Each process is signalled only once: a group id is never signalled after its group may be gone.
        """
        proc = srv.proc
        if proc is None or proc in self._stopping:
            return
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        self._stopping.add(proc)
        if proc.poll() is None:
            _killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                _killpg(pgid, signal.SIGKILL)
                proc.wait()
        _killpg(pgid, signal.SIGKILL)  # members that outlived the leader (workers, grandchildren)
        end_tagged(self._tags.get(proc, ""))  # and those that left its group (setsid) and their parent
        if srv.reader is not None and srv.reader is not threading.current_thread():
            srv.reader.join(timeout=2.0)

    def _event(self, kind: str, target: str, old: Any = None, new: Any = None, ok: bool = True,
               reason: str | None = None, ts: float | None = None) -> None:
        self._inbox.push(Event(ts=time.time() if ts is None else ts, actor="supervisor", kind=kind, target=target, old=old, new=new,
                               ok=ok, reason=reason))


def _relaunch_action(old: ServerSpec, new: ServerSpec | None) -> str:
    """What a restart of an attached server was asked for: the setting that changed ("restart" if none)."""
    if new is None:
        return "restart"
    if new.engine != old.engine:
        return "preload"
    if new.split_ratios() != old.split_ratios():
        return "split"
    if new.share != old.share:
        return "share"
    changed = [f for f in type(new).model_fields if getattr(new, f, None) != getattr(old, f, None)]
    return changed[0] if changed else "restart"


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
