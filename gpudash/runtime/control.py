"""The one place where a reconfiguration is validated, applied and recorded.

Keys, the command palette and the CLI (`gpudash server sleep|wake`, runtime/server_actions.py) all build a
command and call `Controller.apply`. Each command
class carries its own description, event, relaunch flag and application, so the controller dispatches
once. Each command is checked completely before anything changes; then it is applied, and an `Event` with the old and new
values goes to the inbox (so it lands in the store and the event log). A refused command changes
nothing and is recorded too, with ok=False and the reason.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, Protocol

import psutil
from pydantic import ValidationError

from gpudash.engine.config import KNOBS
from gpudash import fmt
from gpudash.config import ServerSpec, parse_knobs, parse_size
from gpudash.records import Event
from gpudash.launcher.shares import oversubscription_warnings, parse_share

ENGINE_KNOBS = KNOBS


class Refused(Exception):
    """A command that cannot be applied; the message is the one-sentence reason."""


# ---- the collaborators, as far as control uses them ----------------------------------------------------

class Engine(Protocol):
    """A transfer engine (engine.TransferEngine): its live knobs."""

    def knobs(self) -> dict[str, Any]: ...

    def set(self, **knobs: Any) -> dict[str, Any]: ...


class ServerState(Protocol):
    server: str
    state: str


class Supervisor(Protocol):
    """The servers' supervisor (gpudash.launcher.supervisor.Supervisor)."""

    def specs(self) -> Mapping[str, ServerSpec]: ...

    def states(self) -> Iterable[ServerState]: ...

    def start(self, name: str) -> None: ...

    def stop(self, name: str) -> None: ...

    def restart(self, name: str, new_spec: ServerSpec | None = None) -> None: ...

    def sleep(self, name: str, level: int = 1) -> Any: ...

    def wake(self, name: str) -> Any: ...

    def refusal(self, name: str, action: str) -> str | None: ...

    def attach(self, spec: ServerSpec) -> None: ...

    def pids(self) -> dict[int, str]: ...


class EventSink(Protocol):
    """Where applied and refused changes go (gpudash.telemetry.inbox.Inbox)."""

    def push(self, record: Event) -> None: ...


class Pool(Protocol):
    """A memory pool (engine.pools.MemoryPool): its shards, their stats and a live resize."""

    @property
    def shards(self) -> tuple[str, ...]: ...

    def shard_stats(self, shard: str) -> Any: ...

    def resize(self, shard: str, capacity: int) -> Any: ...


class Recorder(Protocol):
    """What SetRecording drives: the sink that feeds the store writer (gpudash.runtime.session.StoreRecording)."""

    @property
    def on(self) -> bool: ...

    def set(self, on: bool) -> None: ...


class KnobFollowers(Protocol):
    """Engines outside this process that follow knob changes (gpudash.preload.knobs.PreloadKnobs)."""

    def apply(self, knobs: Mapping[str, Any]) -> Any: ...


# ---- commands: each knows its description, its event, whether it relaunches, and how it applies --------

class ControlCommand(ABC):
    """One reconfiguration. `perform` validates and applies it through the controller's collaborators,
    raising Refused with the reason; `current` reads the value a refused command would have changed."""

    def relaunches(self) -> bool:
        """Whether applying it restarts a server (the UI asks for confirmation first)."""
        return False

    @abstractmethod
    def describe(self) -> str:
        """One line naming what the command will do."""

    @abstractmethod
    def event(self) -> tuple[str, str, Any]:
        """(event kind, target, requested value) of the Event the command is recorded as."""

    @abstractmethod
    def perform(self, c: Controller) -> tuple[Any, Any]:
        """Validate and apply; (old, new) values, or Refused."""

    def current(self, c: Controller) -> Any:
        return None


@dataclass(frozen=True)
class SetEngineKnobs(ControlCommand):
    """Change live transfer-engine knobs, e.g. ``{"h2d_chunk_bytes": 4_000_000}``."""

    knobs: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return "set engine " + ", ".join(f"{k}={fmt.knob(v)}" for k, v in self.knobs.items())

    def event(self) -> tuple[str, str, Any]:
        return "engine.knobs", "engine", dict(self.knobs)

    def perform(self, c: Controller) -> tuple[Any, Any]:
        return c._set_knobs(dict(self.knobs))

    def current(self, c: Controller) -> Any:
        if c.engine is None:
            return None
        current = c.engine.knobs()
        return {k: current[k] for k in self.knobs if k in current}


@dataclass(frozen=True)
class SetSplit(ControlCommand):
    """Change a llama.cpp server's tensor split (``-ts``); re-launches the server."""

    server: str
    ratios: tuple[float, ...]

    def relaunches(self) -> bool:
        return True

    def describe(self) -> str:
        return (f"set {self.server} tensor split to {','.join(f'{r:g}' for r in self.ratios)} "
                f"(re-launches {self.server})")

    def event(self) -> tuple[str, str, Any]:
        return "server.split", self.server, list(self.ratios)

    def perform(self, c: Controller) -> tuple[Any, Any]:
        return c._resplit(self.server, self.ratios)

    def current(self, c: Controller) -> Any:
        return c.supervisor.specs()[self.server].split_ratios() if c.supervisor is not None else None


@dataclass(frozen=True)
class SetShare(ControlCommand):
    """Change the share of each of its GPUs' memory a server may hold; re-launches the server."""

    server: str
    share: float

    def relaunches(self) -> bool:
        return True

    def describe(self) -> str:
        return f"set {self.server} memory share to {self.share:g} (re-launches {self.server})"

    def event(self) -> tuple[str, str, Any]:
        return "server.share", self.server, self.share

    def perform(self, c: Controller) -> tuple[Any, Any]:
        return c._respec(self.server, share=self.share)

    def current(self, c: Controller) -> Any:
        return c.supervisor.specs()[self.server].share if c.supervisor is not None else None


@dataclass(frozen=True)
class SetShardSize(ControlCommand):
    """Resize one shard of one memory pool (live; the pool refuses what live allocations forbid)."""

    pool: str
    shard: str
    capacity: int | str  # bytes, or a size like "256MiB"

    def describe(self) -> str:
        return f"resize shard {self.shard} of pool {self.pool} to {self.capacity}"

    def event(self) -> tuple[str, str, Any]:
        return "pool.shard_size", f"{self.pool}/{self.shard}", self.capacity

    def perform(self, c: Controller) -> tuple[Any, Any]:
        return c._resize_shard(self.pool, self.shard, self.capacity)

    def current(self, c: Controller) -> Any:
        return c.pools()[self.pool].shard_stats(self.shard).capacity if c.pools is not None else None


@dataclass(frozen=True)
class ServerAction(ControlCommand):
    """Start, stop or restart one server, or put a vLLM server to sleep / wake it (timed by the supervisor,
    whose server.sleep / server.wake event carries the seconds)."""

    server: str
    action: Literal["start", "stop", "restart", "sleep", "wake"]
    level: int = 1  # a sleep's level (vLLM 0: scheduling paused, 1: weights to host memory, 2: dropped)

    def relaunches(self) -> bool:
        return self.action in ("stop", "restart")

    def describe(self) -> str:
        return f"{self.action} {self.server}"

    def event(self) -> tuple[str, str, Any]:
        return f"server.{self.action}.request", self.server, self.action

    def perform(self, c: Controller) -> tuple[Any, Any]:
        return c._server_action(self.server, self.action, self.level)

    def current(self, c: Controller) -> Any:
        return _state_of(c.supervisor, self.server) if c.supervisor is not None else None


@dataclass(frozen=True)
class AttachServer(ControlCommand):
    """Read a server found on the GPUs for the rest of this run (attached: gpudash never signals it)."""

    server: str
    kind: str
    url: str

    def describe(self) -> str:
        return f"attach {self.server} ({self.kind} at {self.url}) for this run"

    def event(self) -> tuple[str, str, Any]:
        return "server.attach", self.server, {"kind": self.kind, "url": self.url}

    def perform(self, c: Controller) -> tuple[Any, Any]:
        if c.supervisor is None:
            raise Refused("no servers are supervised by this gpudash, so none can be attached")
        try:
            c.supervisor.attach(ServerSpec(name=self.server, kind=self.kind, url=self.url))
        except Exception as err:  # noqa: BLE001 - a bad name or URL is the refusal
            raise Refused(f"cannot attach {self.server}: {err}") from None
        return None, self.url


@dataclass(frozen=True)
class SetRecording(ControlCommand):
    """Turn recording to the store on or off."""

    on: bool

    def describe(self) -> str:
        return f"turn recording {'on' if self.on else 'off'}"

    def event(self) -> tuple[str, str, Any]:
        return "recording", "store", self.on

    def perform(self, c: Controller) -> tuple[Any, Any]:
        return c._set_recording(self.on)

    def current(self, c: Controller) -> Any:
        return c.recorder.on if c.recorder is not None else None


@dataclass(frozen=True)
class SignalProcess(ControlCommand):
    """Send a signal (TERM, KILL, INT, HUP) to a process the operator owns that gpudash does not supervise
    (the Processes tab); a supervised server stops through ServerAction, or its supervisor restarts it."""

    pid: int
    signal: str
    name: str = ""  # the command, for the description
    started: float | None = None  # the process's start time as shown (psutil's create_time): a reused pid differs

    def describe(self) -> str:
        return f"send SIG{self.signal} to pid {self.pid}" + (f" ({self.name[:60]})" if self.name else "")

    def event(self) -> tuple[str, str, Any]:
        return "process.signal", f"pid {self.pid}", f"SIG{self.signal}"

    def perform(self, c: Controller) -> tuple[Any, Any]:
        return c._signal(self.pid, self.signal, self.started)


Command = (SetEngineKnobs | SetSplit | SetShare | SetShardSize | ServerAction | SetRecording | SignalProcess
           | AttachServer)


@dataclass(frozen=True)
class Result:
    ok: bool
    reason: str | None
    event: Event


def relaunches(command: ControlCommand) -> bool:
    """Whether applying the command restarts a server (the UI asks for confirmation first)."""
    return command.relaunches()


def describe(command: ControlCommand) -> str:
    """One line naming what the command will do."""
    return command.describe()


class Controller:
    """Validates, applies and records commands against the running engine, supervisor and recorder.

    Any of them may be None (e.g. no servers configured); commands that need a missing one are refused.
    One lock serialises apply calls, so two changes never interleave.
    """

    def __init__(self, *, engine: Engine | None = None, supervisor: Supervisor | None = None,
                 inbox: EventSink | None = None, recorder: Recorder | None = None,
                 pools: Callable[[], Mapping[str, Pool]] | None = None,
                 clock: Callable[[], float] = time.time, preload: KnobFollowers | None = None) -> None:
        self.engine = engine
        self.preload = preload  # engine knobs also reach preloaded servers
        self.supervisor = supervisor
        self.pools = pools  # () -> {pool name: engine.pools.MemoryPool}
        self.inbox = inbox
        self.recorder = recorder
        self._clock = clock
        self._lock = threading.Lock()

    def apply(self, command: ControlCommand, actor: str = "keyboard") -> Result:
        """Validate, apply, record. Never raises for a bad command: the Result carries the reason."""
        if not isinstance(command, ControlCommand):
            raise TypeError(f"not a control command: {command!r}")
        kind, target, new = command.event()
        old: Any = None
        with self._lock:
            try:
                old, new = command.perform(self)
                ok, reason = True, None
            except Refused as err:
                ok, reason = False, _readable_sizes(str(err))
                old = self._current(command)
        event = Event(ts=self._clock(), actor=actor, kind=kind, target=target, old=old, new=new,
                      ok=ok, reason=reason)
        if self.inbox is not None:
            self.inbox.push(event)
        return Result(ok, reason, event)

    def discard(self, command: ControlCommand, reason: str, actor: str = "keyboard") -> Event:
        """Record that a proposed command was dropped unapplied (`<kind>.discarded`), for the audit trail."""
        kind, target, new = command.event()
        event = Event(ts=self._clock(), actor=actor, kind=f"{kind}.discarded", target=target, new=new, reason=reason)
        if self.inbox is not None:
            self.inbox.push(event)
        return event

    def _current(self, command: ControlCommand) -> Any:
        """The value a refused command would have changed, for the event row (None when unknown)."""
        try:
            return command.current(self)
        except (KeyError, ValueError, RuntimeError):
            return None

    # -- validation and application, called by the commands ----------------------------------------------

    def _set_knobs(self, knobs: dict[str, Any]) -> tuple[Any, Any]:
        if self.engine is None:
            raise Refused("no transfer engine is running, so engine knobs cannot change")
        if not knobs:
            raise Refused("no engine knob given; name at least one of " + ", ".join(ENGINE_KNOBS))
        unknown = sorted(set(knobs) - set(ENGINE_KNOBS))
        if unknown:
            raise Refused(f"unknown engine knob {', '.join(unknown)}; known knobs: {', '.join(ENGINE_KNOBS)}")
        current = dict(self.engine.knobs())
        try:
            new = parse_knobs(knobs)  # the knob table's rule, values as typed ("4MiB")
        except ValueError as err:
            raise Refused(str(err)) from None
        old = {k: current.get(k) for k in knobs}
        try:
            self.engine.set(**new)  # the engine validates again and applies all or nothing
        except (ValueError, TypeError) as err:  # EngineError is a ValueError subclass or named by message
            raise Refused(str(err)) from None
        except Exception as err:  # noqa: BLE001 - an engine refusal of any type is reported, not raised
            raise Refused(f"the engine refused: {err}") from None
        if self.preload is not None:  # each preloaded server's outcome is an event of its own
            self.preload.apply(new)
        return old, new

    def _spec(self, server: str, action: str | None = None) -> ServerSpec:
        """The server's spec; Refused for an unknown one, or, naming why in one sentence, for `action` on
        an attached server (gpudash only reads those)."""
        if self.supervisor is None:
            raise Refused("no servers are supervised by this gpudash, so none can change")
        specs = self.supervisor.specs()
        if server not in specs:
            raise Refused(f"no server named {server!r}; known: {', '.join(specs) or 'none'}")
        if action is not None and specs[server].attached:
            raise Refused(self.supervisor.refusal(server, action) or f"{server} is attached; gpudash only reads it")
        return specs[server]

    def _resplit(self, server: str, ratios: tuple[float, ...]) -> tuple[Any, Any]:
        """A new split through the spec's own rule (its kind's; one ratio per GPU it runs on)."""
        spec = self._spec(server, "split")
        problem = spec.split_problem(ratios, spec.gpus or range(len(ratios)))
        if problem:
            raise Refused(problem)
        return self._respec(server, **spec.with_split(ratios))

    def _respec(self, server: str, **change: Any) -> tuple[Any, Any]:
        spec = self._spec(server, next(iter(change)))
        if "share" in change:
            self._check_share_fits(server, spec, change["share"])
        try:
            new_spec = ServerSpec.model_validate({**spec.model_dump(), **change})
        except ValidationError as err:
            raise Refused(f"{server}: {_pydantic_reason(err)}") from None
        key = next(iter(change))
        old, new = getattr(spec, key), getattr(new_spec, key)
        try:
            self.supervisor.restart(server, new_spec)  # checks the spec first; on failure restarts the old one
        except Exception as err:  # noqa: BLE001 - the launcher's reason becomes the refusal
            raise Refused(f"{server} did not come up with {key}={new}: {err}") from None
        return old, new

    def _check_share_fits(self, server: str, spec: ServerSpec, share: float) -> None:
        try:
            parse_share(share)
        except ValueError as err:
            raise Refused(str(err)) from None
        after = [spec.model_copy(update={"share": share}) if n == server else s
                 for n, s in self.supervisor.specs().items()]
        gpus = sorted({g for s in after for g in s.gpus})  # a server without a GPU list counts on all of them
        over = [w for w in oversubscription_warnings(after, gpus) if server in w.servers]
        if over:
            raise Refused(over[0].message)

    def _resize_shard(self, pool_name: str, shard: str, capacity: int | str) -> tuple[Any, Any]:
        pools = dict(self.pools()) if self.pools is not None else {}
        if pool_name not in pools:
            raise Refused(f"no memory pool named {pool_name!r}; pools: {', '.join(pools) or 'none yet'}")
        pool = pools[pool_name]
        if shard not in pool.shards:
            raise Refused(f"pool {pool_name} has no shard {shard!r}; shards: {', '.join(pool.shards)}")
        try:
            size = parse_size(capacity)
        except ValueError as err:
            raise Refused(f"shard size: {err}") from None
        old = pool.shard_stats(shard).capacity
        try:
            pool.resize(shard, size)  # all or nothing: the pool refuses with how far it could go
        except (ValueError, TypeError, RuntimeError, MemoryError) as err:  # PoolError is an EngineError
            raise Refused(str(err)) from None
        return old, pool.shard_stats(shard).capacity

    def _server_action(self, server: str, action: str, level: int = 1) -> tuple[Any, Any]:
        self._spec(server, action)
        if action not in ("start", "stop", "restart", "sleep", "wake"):
            raise Refused(f"unknown server action {action!r}; use start, stop, restart, sleep or wake")
        before = _state_of(self.supervisor, server)
        try:
            if action == "sleep":
                self.supervisor.sleep(server, level)
            else:
                getattr(self.supervisor, action)(server)
        except Exception as err:  # noqa: BLE001 - reported as the refusal reason
            raise Refused(f"{action} {server} failed: {err}") from None
        return before, _state_of(self.supervisor, server)

    def _signal(self, pid: int, name: str, started: float | None = None) -> tuple[Any, Any]:
        """Signal `pid` if the user owns it (root owns all), it is no server gpudash supervises or reads and,
        given `started`, it is still the process that started then (the pid was not reused after the
        dialog). Never init or a kernel thread, nor gpudash itself or a process it runs under (its shell,
        its tmux, its sshd): as root, one of those would take the box or this session down."""
        if name not in ("TERM", "KILL", "INT", "HUP"):
            raise Refused(f"unknown signal {name!r}; use TERM, KILL, INT or HUP")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
            raise Refused(f"pid {pid} is not a process gpudash signals (init, or no process at all); "
                          "pick a process from the list")
        server = (self.supervisor.pids() if self.supervisor is not None else {}).get(pid)
        if server is not None:
            raise Refused(self.supervisor.refusal(server, "stop")  # an attached one: gpudash only reads it
                          or f"pid {pid} is server {server}, which gpudash supervises: stop it on Servers (x), "
                             "or its supervisor restarts it")
        mine = [psutil.Process(), *psutil.Process().parents()]
        if pid in {p.pid for p in mine}:
            what = "gpudash itself" if pid == os.getpid() else "a process gpudash runs under (its shell or terminal)"
            raise Refused(f"pid {pid} is {what}; quit gpudash with q instead")
        try:
            proc = psutil.Process(pid)
            uid = proc.uids().real
            if started is not None and proc.create_time() != started:
                raise Refused(f"pid {pid} has exited and the pid now names another process; nothing was signalled")
            if _kernel_thread(proc):
                raise Refused(f"pid {pid} ({proc.name()}) is a kernel thread; the kernel runs it, not a user")
        except (psutil.NoSuchProcess, OverflowError):
            raise Refused(f"pid {pid} has exited") from None
        if os.getuid() not in (0, uid):
            raise Refused(f"pid {pid} belongs to uid {uid}, not to you (uid {os.getuid()})")
        try:
            proc.send_signal(getattr(signal, f"SIG{name}"))
        except (psutil.Error, OSError) as err:
            raise Refused(f"cannot signal pid {pid}: {err}") from None
        return None, f"SIG{name}"

    def _set_recording(self, on: bool) -> tuple[Any, Any]:
        if self.recorder is None:
            raise Refused("recording is not available in this mode")
        old = self.recorder.on
        try:
            self.recorder.set(on)
        except Exception as err:  # noqa: BLE001 - e.g. the DB cannot be opened
            raise Refused(f"cannot turn recording {'on' if on else 'off'}: {err}") from None
        return old, self.recorder.on

    # -- reads for the UI (called from workers) -------------------------------------------------------

    def knobs(self) -> dict[str, Any]:
        return dict(self.engine.knobs()) if self.engine is not None else {}

    def specs(self) -> dict[str, ServerSpec]:
        return dict(self.supervisor.specs()) if self.supervisor is not None else {}


PF_KTHREAD = 0x00200000  # the kernel's flag on its own threads (include/linux/sched.h)


def _kernel_thread(proc: psutil.Process) -> bool:
    """Whether a process is one of the kernel's threads: its flags say so (/proc/PID/stat's ninth field);
    where they cannot be read, kthreadd (pid 2) and its children are."""
    try:
        with open(f"/proc/{proc.pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        return bool(int(fields[6]) & PF_KTHREAD)
    except (OSError, IndexError, ValueError):
        return proc.pid == 2 or proc.ppid() == 2


def _state_of(supervisor: Supervisor, server: str) -> str | None:
    for s in supervisor.states():
        if s.server == server:
            return s.state
    return None


# A byte count as the engine, its pools and the launcher word it: "N bytes", or "N to M bytes".
_BYTE_COUNT = re.compile(r"(?<![\w*.])(\d+)(?: to (\d+))? bytes\b")


def _readable_sizes(reason: str) -> str:
    """The refusal with its byte counts as MiB/GiB (the engine stands alone and words them in bytes)."""
    def one(m: re.Match[str]) -> str:
        first = fmt.size_to_act_on(int(m[1]))
        return f"{first} to {fmt.size_to_act_on(int(m[2]))}" if m[2] else first

    return _BYTE_COUNT.sub(one, reason)


def _pydantic_reason(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
