"""The one place where a reconfiguration is validated, applied and recorded.

Keys, the command palette and CLI tools all build a command and call `Controller.apply`. Each command is
checked completely before anything changes; then it is applied, and an `Event` with the old and new
values goes to the inbox (so it lands in the store and the event log). A refused command changes
nothing and is recorded too, with ok=False and the reason.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Protocol

from pydantic import ValidationError

from gpudash.config import EngineSettings, ServerSpec, parse_size
from gpudash.records import Event
from gpudash.shares import oversubscription_warnings, parse_share

ENGINE_KNOBS = tuple(EngineSettings.model_fields)


class Refused(Exception):
    """A command that cannot be applied; the message is the one-sentence reason."""


@dataclass(frozen=True)
class SetEngineKnobs:
    """Change live transfer-engine knobs, e.g. ``{"h2d_chunk_bytes": 4_000_000}``."""

    knobs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SetSplit:
    """Change a llama.cpp server's tensor split (``-ts``); re-launches the server."""

    server: str
    ratios: tuple[float, ...]


@dataclass(frozen=True)
class SetShare:
    """Change the share of each of its GPUs' memory a server may hold; re-launches the server."""

    server: str
    share: float


@dataclass(frozen=True)
class SetShardSize:
    """Resize one shard of one memory pool (live; the pool refuses what live allocations forbid)."""

    pool: str
    shard: str
    capacity: int | str  # bytes, or a size like "256MiB"


@dataclass(frozen=True)
class ServerAction:
    """Start, stop or restart one server."""

    server: str
    action: Literal["start", "stop", "restart"]


@dataclass(frozen=True)
class SetRecording:
    """Turn recording to the store on or off."""

    on: bool


Command = SetEngineKnobs | SetSplit | SetShare | SetShardSize | ServerAction | SetRecording


@dataclass(frozen=True)
class Result:
    ok: bool
    reason: str | None
    event: Event


class Recorder(Protocol):
    """What SetRecording drives: the sink that feeds the store writer."""

    @property
    def on(self) -> bool: ...

    def set(self, on: bool) -> None: ...


def relaunches(command: Command) -> bool:
    """Whether applying the command restarts a server (the UI asks for confirmation first)."""
    return isinstance(command, (SetSplit, SetShare)) or (
        isinstance(command, ServerAction) and command.action in ("stop", "restart"))


def describe(command: Command) -> str:
    """One line naming what the command will do."""
    match command:
        case SetEngineKnobs(knobs):
            return "set engine " + ", ".join(f"{k}={v}" for k, v in knobs.items())
        case SetSplit(server, ratios):
            return f"set {server} tensor split to {','.join(f'{r:g}' for r in ratios)} (re-launches {server})"
        case SetShare(server, share):
            return f"set {server} memory share to {share:g} (re-launches {server})"
        case SetShardSize(pool, shard, capacity):
            return f"resize shard {shard} of pool {pool} to {capacity}"
        case ServerAction(server, action):
            return f"{action} {server}"
        case SetRecording(on):
            return f"turn recording {'on' if on else 'off'}"
    raise TypeError(f"not a control command: {command!r}")


class Controller:
    """Validates, applies and records commands against the running engine, supervisor and recorder.

    Any of them may be None (e.g. no servers configured); commands that need a missing one are refused.
    One lock serialises apply calls, so two changes never interleave.
    """

    def __init__(self, *, engine: Any = None, supervisor: Any = None, inbox: Any = None,
                 recorder: Recorder | None = None, pools: Callable[[], Mapping[str, Any]] | None = None,
                 clock: Callable[[], float] = time.time, preload: Any = None) -> None:
        self.engine = engine
        self.preload = preload  # gpudash.preload.PreloadKnobs: engine knobs also reach preloaded servers
        self.supervisor = supervisor
        self.pools = pools  # () -> {pool name: engine.pools.MemoryPool}
        self.inbox = inbox
        self.recorder = recorder
        self._clock = clock
        self._lock = threading.Lock()

    def apply(self, command: Command, actor: str = "keyboard") -> Result:
        """Validate, apply, record. Never raises for a bad command: the Result carries the reason."""
        kind, target, old, new = self._describe_change(command)
        with self._lock:
            try:
                old, new = self._apply(command)
                ok, reason = True, None
            except Refused as err:
                ok, reason = False, str(err)
                old = self._current(command)
        event = Event(ts=self._clock(), actor=actor, kind=kind, target=target, old=old, new=new,
                      ok=ok, reason=reason)
        if self.inbox is not None:
            self.inbox.push(event)
        return Result(ok, reason, event)

    def _current(self, command: Command) -> Any:
        """The value a refused command would have changed, for the event row (None when unknown)."""
        try:
            match command:
                case SetEngineKnobs(knobs) if self.engine is not None:
                    current = self.engine.knobs()
                    return {k: current[k] for k in knobs if k in current}
                case SetSplit(server) if self.supervisor is not None:
                    return self.supervisor.specs()[server].tensor_split
                case SetShare(server) if self.supervisor is not None:
                    return self.supervisor.specs()[server].share
                case SetShardSize(pool, shard) if self.pools is not None:
                    return self.pools()[pool].shard_stats(shard).capacity
                case ServerAction(server) if self.supervisor is not None:
                    return _state_of(self.supervisor, server)
                case SetRecording() if self.recorder is not None:
                    return self.recorder.on
        except (KeyError, ValueError, RuntimeError):
            return None
        return None

    # -- per-command validation and application -------------------------------------------------------

    def _describe_change(self, command: Command) -> tuple[str, str, Any, Any]:
        match command:
            case SetEngineKnobs(knobs):
                return "engine.knobs", "engine", None, dict(knobs)
            case SetSplit(server, ratios):
                return "server.split", server, None, list(ratios)
            case SetShare(server, share):
                return "server.share", server, None, share
            case SetShardSize(pool, shard, capacity):
                return "pool.shard_size", f"{pool}/{shard}", None, capacity
            case ServerAction(server, action):
                return f"server.{action}.request", server, None, action
            case SetRecording(on):
                return "recording", "store", None, on
        raise TypeError(f"not a control command: {command!r}")

    def _apply(self, command: Command) -> tuple[Any, Any]:
        match command:
            case SetEngineKnobs(knobs):
                return self._set_knobs(dict(knobs))
            case SetSplit(server, ratios):
                return self._respec(server, tensor_split=[float(r) for r in ratios])
            case SetShare(server, share):
                return self._respec(server, share=share)
            case SetShardSize(pool, shard, capacity):
                return self._resize_shard(pool, shard, capacity)
            case ServerAction(server, action):
                return self._server_action(server, action)
            case SetRecording(on):
                return self._set_recording(on)
        raise TypeError(f"not a control command: {command!r}")

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
            checked = EngineSettings.model_validate({**{k: v for k, v in current.items() if k in ENGINE_KNOBS},
                                                     **knobs})
        except ValidationError as err:
            raise Refused(_pydantic_reason(err)) from None
        new = {k: getattr(checked, k) for k in knobs}
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

    def _spec(self, server: str) -> ServerSpec:
        if self.supervisor is None:
            raise Refused("no servers are supervised by this gpudash, so none can change")
        specs = self.supervisor.specs()
        if server not in specs:
            raise Refused(f"no server named {server!r}; known: {', '.join(specs) or 'none'}")
        return specs[server]

    def _respec(self, server: str, **change: Any) -> tuple[Any, Any]:
        spec = self._spec(server)
        if "tensor_split" in change:
            ratios = change["tensor_split"]
            if spec.kind != "llama.cpp":
                raise Refused(f"{server} is a {spec.kind} server; split ratios (-ts) apply to llama.cpp only")
            if spec.gpus and len(ratios) != len(spec.gpus):
                raise Refused(f"{server} runs on {len(spec.gpus)} GPUs {spec.gpus}; give {len(spec.gpus)} "
                              f"ratios, not {len(ratios)}")
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

    def _server_action(self, server: str, action: str) -> tuple[Any, Any]:
        self._spec(server)
        if action not in ("start", "stop", "restart"):
            raise Refused(f"unknown server action {action!r}; use start, stop or restart")
        before = _state_of(self.supervisor, server)
        try:
            getattr(self.supervisor, action)(server)
        except Exception as err:  # noqa: BLE001 - reported as the refusal reason
            raise Refused(f"{action} {server} failed: {err}") from None
        return before, _state_of(self.supervisor, server)

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


def _state_of(supervisor: Any, server: str) -> str | None:
    for s in supervisor.states():
        if s.server == server:
            return s.state
    return None


def _pydantic_reason(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
