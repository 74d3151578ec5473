"""Energy per server and per token: each server's share of its GPUs' energy, tick by tick, beside its tokens.

A server's energy is that of the GPUs it runs on (the GPU processes tagged with its name: NVML's, or the sim
rig's). A GPU that one server alone runs on is all its (`split = "whole_gpu"`); one that several servers
share is split by their processes' share of its SM utilisation over the tick (NVML's per-process
utilisation, `"sm_share"`); where that is unknown for a shared GPU, its energy is attributed to none and
counted as `unattributed_j` on each server sharing it, never guessed. Energy while the server had a request
in flight (at either end of the tick) or generated a token in it is busy, else idle.

Tokens are the change of the server's own token counts (`generation_tokens_total`, `prompt_tokens_total`)
between two reads of its /metrics, so they cover the same intervals as the energy, exactly; a count that
went down is a restarted server, whose new count is all new. A kind that reports no counts gives its rate
times the time since its previous read instead (a windowed rate smears a burst over its window). A tick whose
/metrics was not read (`requests_running` unknown) counts none: its `tokens_per_s` is then the last
request's decode speed from the server's log (launcher/supervisor.py), not a throughput, and the next read
covers the gap. `ServerEnergyMeter` is a sampler deriver: fed every tick's Snapshot in order, it returns that
tick's `server_energy` records.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpudash.records import GpuProcessSample, GpuSample, ServerEnergySample, ServerSample, Snapshot

WINDOW_S = 60.0
WHOLE_GPU, SM_SHARE = "whole_gpu", "sm_share"


def gpu_deltas(prev: Iterable[GpuSample], cur: Iterable[GpuSample]) -> dict[int, float]:
    """Joules each GPU spent between two ticks, from its energy counter; a GPU whose counter is missing at
    either end, changed kind, or went down (a driver reload) has none."""
    before = {g.index: g for g in prev}
    out: dict[int, float] = {}
    for g in cur:
        p = before.get(g.index)
        if p is None or p.energy_j is None or g.energy_j is None or p.energy_source != g.energy_source:
            continue
        if g.energy_j >= p.energy_j:
            out[g.index] = g.energy_j - p.energy_j
    return out


def split_gpu(joules: float, sm: Mapping[str, float | None]) -> tuple[dict[str, float], str | None]:
    """One GPU's joules over the servers on it ({server: its processes' SM %, None: unknown}): ({server:
    joules}, split), where split is "whole_gpu" for one server, "sm_share" for several with known SM use,
    and None (nothing attributed) for several where a share is unknown or all are 0."""
    if len(sm) == 1:
        return {next(iter(sm)): joules}, WHOLE_GPU
    shares = list(sm.values())
    total = sum(s for s in shares if s is not None)
    if not sm or any(s is None for s in shares) or total <= 0:
        return {}, None
    return {server: joules * (s or 0.0) / total for server, s in sm.items()}, SM_SHARE


def servers_per_gpu(procs: Iterable[GpuProcessSample]) -> dict[int, dict[str, float | None]]:
    """{GPU: {server: SM % of its processes there (None where one is unknown)}} from the tick's GPU processes."""
    out: dict[int, dict[str, float | None]] = {}
    for p in procs:
        if p.server is None:
            continue
        on = out.setdefault(p.gpu_index, {})
        have = on.get(p.server, 0.0)
        on[p.server] = None if have is None or p.sm_pct is None else have + p.sm_pct
    return out


def _tokens(total: float | None, last: float | None, rate: float | None, since: float) -> float:
    """Tokens since the previous read: the count's change where both reads have one, else rate times time."""
    if total is not None and last is not None:
        return total - last if total >= last else total
    return (rate or 0.0) * since


def _busy(s: ServerSample, prev: ServerSample | None) -> bool:
    running = [x.requests_running for x in (s, prev) if x is not None and x.requests_running is not None]
    read = s.requests_running is not None  # else tokens_per_s is a log line's decode speed (see above)
    return any(r > 0 for r in running) or (read and bool(s.tokens_per_s or s.prompt_tokens_per_s))


@dataclass
class _Account:
    """What one server has been counted since gpudash began watching it, and its last minute."""

    busy_j: float = 0.0
    idle_j: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    unattributed_j: float = 0.0
    split: str = WHOLE_GPU
    gpus: tuple[int, ...] = ()
    read_at: float = 0.0  # when its tokens were last counted (a /metrics read)
    generation_total: float | None = None  # the server's own counts at that read
    prompt_total: float | None = None
    window: deque[tuple[float, float, float, float]] = field(default_factory=deque)  # (ts, J, gen, prompt) cum.

    def per_window(self, ts: float) -> tuple[float | None, float | None]:
        energy = self.busy_j + self.idle_j
        self.window.append((ts, energy, self.generation_tokens, self.prompt_tokens))
        while len(self.window) > 2 and self.window[1][0] <= ts - WINDOW_S:
            self.window.popleft()
        t0, j0, g0, p0 = self.window[0]
        j, gen, prompt = energy - j0, self.generation_tokens - g0, self.prompt_tokens - p0
        return (j / gen if gen > 0 else None), (1000.0 * j / prompt if prompt > 0 else None)


class ServerEnergyMeter:
    """Counts each server's energy and tokens over the ticks it is fed (one meter per run)."""

    def __init__(self) -> None:
        self._prev: Snapshot | None = None
        self._accounts: dict[str, _Account] = {}

    def __call__(self, snap: Snapshot) -> dict[str, tuple]:
        return {"server_energy": self.update(snap)}

    def update(self, snap: Snapshot) -> tuple[ServerEnergySample, ...]:
        prev, self._prev = self._prev, snap
        if prev is None or snap.ts <= prev.ts:
            return ()
        before = {s.server: s for s in prev.servers}
        on_gpu = servers_per_gpu(snap.gpu_processes)
        got: dict[str, float] = {}
        unattributed: dict[str, float] = {}
        splits: dict[str, set[str]] = {}
        gpus_of: dict[str, set[int]] = {}
        for gpu, sm in on_gpu.items():
            for server in sm:
                gpus_of.setdefault(server, set()).add(gpu)
        for gpu, joules in gpu_deltas(prev.gpus, snap.gpus).items():
            sm = on_gpu.get(gpu, {})
            shares, split = split_gpu(joules, sm)
            for server in sm:
                if split is None:
                    unattributed[server] = unattributed.get(server, 0.0) + joules
                else:
                    got[server] = got.get(server, 0.0) + shares[server]
                    splits.setdefault(server, set()).add(split)
        out = []
        for s in snap.servers:
            if s.server not in gpus_of:
                continue
            acc = self._accounts.get(s.server)
            if acc is None:  # counting begins at the previous tick, at 0
                acc = self._accounts[s.server] = _Account(window=deque([(prev.ts, 0.0, 0.0, 0.0)]))
                if (last := before.get(s.server)) is not None and last.requests_running is not None:
                    acc.generation_total, acc.prompt_total = last.generation_tokens_total, last.prompt_tokens_total
            j = got.get(s.server, 0.0)
            if _busy(s, before.get(s.server)):
                acc.busy_j += j
            else:
                acc.idle_j += j
            acc.unattributed_j += unattributed.get(s.server, 0.0)
            if s.requests_running is not None:  # its /metrics was read this tick
                since = snap.ts - (acc.read_at or prev.ts)
                acc.generation_tokens += _tokens(s.generation_tokens_total, acc.generation_total, s.tokens_per_s, since)
                acc.prompt_tokens += _tokens(s.prompt_tokens_total, acc.prompt_total, s.prompt_tokens_per_s, since)
                acc.generation_total, acc.prompt_total = s.generation_tokens_total, s.prompt_tokens_total
                acc.read_at = snap.ts
            acc.split = SM_SHARE if SM_SHARE in splits.get(s.server, ()) else WHOLE_GPU
            acc.gpus = tuple(sorted(gpus_of[s.server]))
            per_token, per_kprompt = acc.per_window(snap.ts)
            out.append(ServerEnergySample(
                ts=snap.ts, server=s.server, gpus=",".join(map(str, acc.gpus)), split=acc.split, busy_j=acc.busy_j,
                idle_j=acc.idle_j, generation_tokens=acc.generation_tokens, prompt_tokens=acc.prompt_tokens,
                j_per_token_1m=per_token, j_per_kprompt_1m=per_kprompt, unattributed_j=acc.unattributed_j))
        return tuple(out)
