"""Follows each applied split, share or engine-knob change with an Events entry of J/token before and after.

A sampler deriver placed after the energy meter (telemetry/server_energy.py): it keeps each counted
server's cumulative energy and tokens for the last window, and when a change's event passes it takes the
window before the change, waits until the change has taken effect (a relaunched server is ready again
under a new process; a knob at once) and one window more, then adds `<change kind>.energy` for the same
target, its old/new the J/token before/after, its reason advisor/energy_compare.py's sentence. A server
that never comes back within GIVE_UP_S gets the entry too, saying there was not enough traffic.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpudash.advisor.energy_compare import MIN_TOKENS, combined, side, verdict
from gpudash.records import Event, Snapshot, ServerState

COMPARED = ("server.split", "server.share", "engine.knobs")
RELAUNCHING = ("server.split", "server.share")
WINDOW_S = 60.0
GIVE_UP_S = 600.0


@dataclass
class _Pending:
    change: Event
    servers: tuple[str, ...]
    pids: dict[str, int | None]  # each server's process when the change was made (a relaunch gets a new one)
    before: Any
    after_from: float | None = None
    samples: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)


class EnergyComparisons:
    """The deriver: `__call__(snap)` returns the tick's events with any finished comparisons added."""

    def __init__(self, window_s: float | None = None, min_tokens: float | None = None) -> None:
        self.window_s = WINDOW_S if window_s is None else window_s
        self.min_tokens = MIN_TOKENS if min_tokens is None else min_tokens
        self._history: dict[str, deque[tuple[float, float, float]]] = {}
        self._pids: dict[str, int | None] = {}
        self._pending: list[_Pending] = []

    def __call__(self, snap: Snapshot) -> dict[str, Any]:
        for e in snap.server_energy:
            h = self._history.setdefault(e.server, deque())
            h.append((e.ts, e.energy_j, e.generation_tokens))
            while h and h[0][0] < e.ts - 2 * self.window_s:
                h.popleft()
        for change in snap.events:
            if change.ok and change.kind in COMPARED:
                self._start(change)
        done = [self._step(p, snap) for p in list(self._pending)]
        for s in snap.servers:
            self._pids[s.server] = s.pid
        added = tuple(e for e in done if e is not None)
        return {"events": snap.events + added} if added else {}

    def _start(self, change: Event) -> None:
        servers = tuple(self._history) if change.kind == "engine.knobs" else (change.target,)
        before = combined(side(list(self._history.get(s, ())), change.ts - self.window_s, change.ts)
                          for s in servers)
        self._pending.append(_Pending(change, servers, {s: self._pids.get(s) for s in servers}, before))

    def _step(self, p: _Pending, snap: Snapshot) -> Event | None:
        if p.after_from is None:
            if p.change.kind not in RELAUNCHING:
                p.after_from = p.change.ts
            else:
                now = {s.server: s for s in snap.servers}
                back = all(s in now and now[s].state is ServerState.READY and now[s].pid != p.pids.get(s)
                           for s in p.servers)
                if back:
                    p.after_from = snap.ts
        if p.after_from is not None:
            for e in snap.server_energy:
                if e.server in p.servers and e.ts >= p.after_from:
                    p.samples.setdefault(e.server, []).append((e.ts, e.energy_j, e.generation_tokens))
            if snap.ts < p.after_from + self.window_s:
                return None
            after = combined(side(p.samples.get(s, []), p.after_from, p.after_from + self.window_s)
                             for s in p.servers)
        elif snap.ts < p.change.ts + GIVE_UP_S:
            return None
        else:
            after = None
        self._pending.remove(p)
        old, new, why = verdict(p.before, after, self.window_s, self.min_tokens)
        c = p.change
        return Event(ts=snap.ts, actor="gpudash", kind=f"{c.kind}.energy", target=c.target, old=old, new=new,
                     reason=f"{why} (the change at {c.ts:.0f}: {c.old} -> {c.new})")
