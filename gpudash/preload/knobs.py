"""gpudash's side of the processes that run the transfer engine through libgpudash_preload.so: which
knobs they start with, which of them are running, and live knob changes sent to them.

A preloaded process is found by its stats block (/dev/shm/gpudash-preload-stats-<pid>) and named by the
name in that block, which `gpudash run` and the supervisor set to the server's name; the supervisor's
{pid: server} map names the ones whose block does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpudash.preload import shm as P
from gpudash.engine.errors import EngineError
from gpudash.config import EngineSettings
from gpudash.records import Event

Pids = Callable[[], Mapping[int, str]]


def file_knobs(settings: EngineSettings) -> dict[str, Any]:
    """The preload knobs the config's [engine] section sets: those left unset keep the library's own
    defaults (staging threads from the cores the process may use, a tuned result for this machine)."""
    return P.preload_knobs({k: getattr(settings, k) for k in settings.model_fields_set})


def preloaded(pids: Pids | None = None, shm_dir: Path = P.SHM_DIR) -> dict[int, str]:
    """{pid: name} of every live process with a stats block; the supervisor's name for its servers'
    processes, else the block's name, else "pid N"."""
    known = dict(pids()) if pids is not None else {}
    out: dict[int, str] = {}
    for pid in P.preload_pids(shm_dir):
        name = known.get(pid)
        if name is None:
            try:
                with P.StatsView(pid, shm_dir) as view:
                    name = view.read().name
            except EngineError:
                continue  # not initialised yet, or not ours to read: the next tick tries again
        out[pid] = name or f"pid {pid}"
    return out


class PreloadKnobs:
    """Sends changed engine knobs to the preloaded processes of the supervised servers (`pids`, the
    supervisor's {pid: server}; a `gpudash run` program keeps its start-up knobs): each gets the knobs it
    runs with plus the change, validated by the engine's own rules before any block is written; whether
    it applied or refused them becomes one `preload.knobs` event per process."""

    def __init__(self, inbox: Any, pids: Pids, shm_dir: Path = P.SHM_DIR, wait_s: float = 1.0,
                 clock: Callable[[], float] = time.time, remember: Callable[[dict[str, Any]], None] | None = None) -> None:
        """`remember` keeps each change for the servers' next starts (the supervisor's preload_knobs.update),
        so a restarted server runs with the knobs the operator chose."""
        self._inbox = inbox
        self._pids = pids
        self._remember = remember
        self._shm_dir = shm_dir
        self._wait_s = wait_s
        self._clock = clock

    def apply(self, knobs: Mapping[str, Any]) -> list[Event]:
        """Write `knobs` (those a preloaded engine has) to each supervised server's process; the events."""
        change = P.preload_knobs(knobs)
        if not change:
            return []
        if self._remember is not None:
            self._remember(change)
        events: list[Event] = []
        planned: list[tuple[int, str, dict[str, Any], dict[str, Any]]] = []
        servers = dict(self._pids())
        for pid in P.preload_pids(self._shm_dir):
            if pid not in servers:
                continue
            name = servers[pid]
            try:
                with P.StatsView(pid, self._shm_dir) as view:
                    stats = view.read()
                if stats.state != "active":
                    raise EngineError(f"it passes every copy through (state {stats.state})")
                new = {**stats.knobs, **change}
                P.encode_knobs(new)
            except EngineError as err:
                events.append(self._event(name, None, change, False, f"knobs not sent: {err}"))
                continue
            planned.append((pid, name, {k: stats.knobs[k] for k in change}, new))
        sent: list[tuple[int, str, dict[str, Any], int]] = []
        for pid, name, old, new in planned:
            try:
                with P.KnobBlock(pid, self._shm_dir) as block:
                    sent.append((pid, name, old, block.write(new)))
            except EngineError as err:
                events.append(self._event(name, old, change, False, f"knobs not sent: {err}"))
        events += self._outcomes(sent, change)
        for e in events:
            self._inbox.push(e)
        return events

    def _outcomes(self, sent: list[tuple[int, str, dict[str, Any], int]], change: dict[str, Any]) -> list[Event]:
        """Wait (up to wait_s in all) for each process to apply or refuse its generation."""
        deadline = time.monotonic() + self._wait_s
        waiting = {pid: (name, old, gen) for pid, name, old, gen in sent}
        events: list[Event] = []
        while waiting:
            for pid, (name, old, gen) in list(waiting.items()):
                try:
                    result = P.outcome(pid, gen, self._shm_dir)
                except EngineError:
                    result = "gone"
                if result == "pending" and time.monotonic() < deadline:
                    continue
                del waiting[pid]
                reason = {"applied": None,
                          "rejected": f"the process refused knob generation {gen}; its previous knobs stay in force",
                          "gone": "the process exited before applying them",
                          "pending": f"the process did not apply knob generation {gen} within {self._wait_s:g} s; "
                                     "it applies it when it next polls its knob block"}[result]
                events.append(self._event(name, old, change, result == "applied", reason, pid))
            if waiting:
                time.sleep(0.01)
        return events

    def _event(self, name: str, old: Any, new: Any, ok: bool, reason: str | None, pid: int | None = None) -> Event:
        target = name if pid is None else f"{name} (pid {pid})"
        return Event(ts=self._clock(), actor="control", kind="preload.knobs", target=target, old=old, new=dict(new),
                     ok=ok, reason=reason)
