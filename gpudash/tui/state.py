"""What the views draw, kept apart from the widgets: snapshots go in, small view models come out.

Pure Python (no textual) so the arithmetic behind the screens - link fractions, downgrade detection,
split balance - is tested without a terminal, and replay can rebuild it by re-ingesting snapshots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from gpudash.advisor.planner import PlanError, SplitPlan, plan_split
from gpudash.advisor.rates import RatesUnavailable, budgets_from_samples
from gpudash.config import ServerSpec
from gpudash.launcher.logparse import says_no_gpu_offload
from gpudash.records import GPU_FAULT_KINDS, Event, RequestSample, ServerState, Snapshot
from gpudash.launcher.shares import ShareWarning, share_warnings
from gpudash.telemetry.links import link_status

HISTORY_TICKS = 120  # points kept for the live PCIe plots
REQUESTS_KEPT = 2000  # probe requests kept for the latency view
EVENTS_KEPT = 5000
RATE_WINDOW_S = 10.0  # server rates are averaged over this much time: one tick alone swings 0 <-> peak
DEMO_CPU_WINDOW_S = 30.0  # the demo's cost in the header: its llama-server's CPU over this much time (probe bursts)

@dataclass(frozen=True, slots=True)
class SplitRow:
    """One GPU's part of one split model: what the spec asks for against what the GPU holds."""

    server: str
    gpu: int
    target: float  # fraction of the model this GPU should hold
    held_bytes: int
    actual: float | None  # fraction it holds, None until the server holds memory anywhere
    imbalance: float | None  # actual - target (fraction points)


def split_gpus(spec: ServerSpec, gpu_count: int) -> list[int]:
    """The GPUs a server's model is split over: its `gpus`, else as many as its -ts has entries."""
    if spec.gpus:
        return list(spec.gpus)
    return list(range(min(gpu_count, len(spec.split_ratios() or ()))))


def split_servers(specs: Iterable[ServerSpec], gpu_count: int) -> list[ServerSpec]:
    """Servers whose model is split across more than one GPU (an unset GPU list alone is not a split)."""
    return [s for s in specs if len(split_gpus(s, gpu_count)) > 1]


def split_balance(spec: ServerSpec, snapshot: Snapshot) -> list[SplitRow]:
    """Target ratio per GPU (``-ts``, equal when unset) beside the memory its processes hold there."""
    gpus = split_gpus(spec, len(snapshot.gpus))
    ratios = list(spec.split_ratios() or [1.0] * len(gpus))
    ratios = (ratios + [0.0] * len(gpus))[: len(gpus)]
    total_ratio = sum(ratios) or 1.0
    held = {g: 0 for g in gpus}
    for p in snapshot.gpu_processes:
        if p.server == spec.name and p.gpu_index in held and p.used_bytes:
            held[p.gpu_index] += p.used_bytes
    total_held = sum(held.values())
    rows = []
    for g, r in zip(gpus, ratios):
        target = r / total_ratio
        actual = held[g] / total_held if total_held else None
        rows.append(SplitRow(spec.name, g, target, held[g], actual,
                             None if actual is None else actual - target))
    return rows


def held_by(spec: ServerSpec, snapshot: Snapshot) -> dict[int, int]:
    """Bytes the server's processes hold on each GPU it is split over (what a re-launch releases)."""
    held = {g: 0 for g in split_gpus(spec, len(snapshot.gpus))}
    for p in snapshot.gpu_processes:
        if p.server == spec.name and p.gpu_index in held and p.used_bytes:
            held[p.gpu_index] += p.used_bytes
    return held


def recommend_split(spec: ServerSpec, snapshot: Snapshot, model_bytes: int | None) -> SplitPlan | str:
    """The planner's `-ts` for a split server from this tick (free memory plus what the server itself
    holds, memory balance), or one sentence saying why there is none. The model's size is its file
    size (weights) when known, else what the server holds now. Pure arithmetic: cheap on the UI thread."""
    held = held_by(spec, snapshot)
    need = model_bytes or sum(held.values())
    if not need:
        return "no plan yet: the model file's size is unknown and the server holds no GPU memory"
    gpus = [g for g in snapshot.gpus if g.index in held]
    if len(gpus) != len(held):
        return f"no plan: GPUs {sorted(set(held) - {g.index for g in gpus})} are not in this tick"
    try:
        return plan_split(budgets_from_samples(gpus, held=held), need)
    except (PlanError, RatesUnavailable) as err:
        return str(err)


def ts_ratios(ts: str) -> tuple[float, ...]:
    """'2,3' -> (2.0, 3.0): the planner's -ts as SetSplit ratios."""
    return tuple(float(x) for x in ts.split(","))


def runs_plan(spec: ServerSpec, plan: SplitPlan) -> bool:
    """Whether the server's -ts already is the plan's, as proportions (0.4,0.6 is 2,3)."""
    current, planned = list(spec.split_ratios() or ()), ts_ratios(plan.ts)
    if len(current) != len(planned) or sum(current) <= 0:
        return False
    return all(abs(c / sum(current) - p / sum(planned)) < 1e-6 for c, p in zip(current, planned))


class ViewState:
    """Everything the views need, built by ingesting snapshots in order (live or replayed)."""

    def __init__(self, feed: Any = None, config_path: Path | None = None, export_dir: Path | None = None) -> None:
        self.feed = feed  # the started feed's FeedInfo (source, DB path, controller), None before it starts
        self.config_path = config_path  # where the Engine view's `w` saves knob changes (None: no file)
        self.export_dir = export_dir or Path.cwd()  # where History's export proposes its folder
        # The knobs as the config file has them; None where there is nothing to save into (a replay: its
        # knob changes are the recording's, and there is no live config to save them into).
        self.saved_knobs: dict[str, object] | None = None
        self.live = False  # a running rig (not a recording): its pids are processes that run now
        self.proc_info: dict[int, Any] = {}  # pid -> procinfo.ProcInfo (user, command), looked up live only
        self.proc_asked: set[int] = set()  # pids looked up, or being looked up
        self.server_warnings: dict[str, tuple[str, ...]] = {}  # per server: what its log warned since it started
        self.cpu_builds: dict[str, str] = {}  # server -> its llama-server: a build without GPU offload
        self.latest: Snapshot | None = None
        # per GPU: (TX, RX) history as a fraction of what the link could carry at that tick
        self.link_history: dict[int, tuple[deque[float], deque[float]]] = {}
        self.use_history: dict[int, tuple[deque[float], deque[float]]] = {}  # per GPU: (util, memory) 0..1
        self.requests: deque[RequestSample] = deque(maxlen=REQUESTS_KEPT)
        self.events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self.faults: dict[int, Event] = {}  # per GPU index: the latest driver fault (Xid, ECC, lost)
        self.specs: dict[str, ServerSpec] = {}
        self.knobs: dict[str, object] = {}
        self.ticks = 0
        self.model_bytes: dict[str, int] = {}  # model file size per server (read off the UI thread)
        # Share warnings of the latest tick; a low-free-memory-at-start warning stays until that server
        # starts again (it is only detectable in the tick of its start event).
        self.warnings: tuple[ShareWarning, ...] = ()
        self._start_warnings: dict[str, tuple[ShareWarning, ...]] = {}
        self._rates: dict[str, deque[tuple[float, float]]] = {}  # per server: (ts, tok/s) while ready
        self.demo: str | None = None  # the embedded demo's server name, when the run started it
        self._cpu: dict[str, deque[tuple[float, float]]] = {}  # per server: (ts, % of a core) of its processes
        # per engine path (server, path, direction): (ts, bytes moved so far) over the last RATE_WINDOW_S
        self._moved: dict[tuple[str | None, str, str], deque[tuple[float, int]]] = {}

    def begin(self, feed: Any, live: bool) -> None:
        """The feed started: its servers and knobs (a live run also remembers the knobs it started with)."""
        self.feed = feed
        self.specs, self.knobs = dict(feed.specs), dict(feed.knobs)
        self.demo = getattr(feed, "demo", None)
        self.saved_knobs = dict(feed.knobs) if live else None
        self.live = live

    def rewound(self) -> ViewState:
        """A state as the feed began (replay's seek re-ingests the ticks before the seek point into it)."""
        fresh = ViewState(self.feed, self.config_path, self.export_dir)
        if self.feed is not None:
            fresh.begin(self.feed, live=self.saved_knobs is not None)
        fresh.model_bytes = dict(self.model_bytes)
        return fresh

    def unsaved_knobs(self) -> dict[str, object]:
        """Knobs changed in this run that the config file does not have yet."""
        saved = self.saved_knobs or {}
        return {k: v for k, v in self.knobs.items() if k in saved and v != saved[k]}

    def server_gpus(self, spec: ServerSpec) -> list[int] | None:
        """The GPUs a server runs on: its `gpus`, else every GPU of the rig (None before the first tick)."""
        if spec.gpus:
            return list(spec.gpus)
        return list(range(len(self.latest.gpus))) if self.latest is not None else None

    def server_names(self) -> list[str]:
        """The servers of the latest tick, else the configured ones (before the first tick with servers)."""
        snap = self.latest
        return [s.server for s in snap.servers] if snap and snap.servers else list(self.specs)

    def _track_rate(self, server: str, state: ServerState, ts: float, value: float | None) -> None:
        window = self._rates.setdefault(server, deque())
        if state is not ServerState.READY:  # a stopped or re-launching server has no rate, and its old one is history
            window.clear()
            return
        if value is not None:
            window.append((ts, value))
        while window and window[0][0] < ts - RATE_WINDOW_S:
            window.popleft()

    def _track_moved(self, snap: Snapshot) -> None:
        for p in snap.engine_paths:
            window = self._moved.setdefault((p.server, p.path, p.direction), deque())
            if window and p.bytes_total < window[-1][1]:  # the counters began again (a new engine)
                window.clear()
            window.append((p.ts, p.bytes_total))
            while len(window) > 2 and window[0][0] < p.ts - RATE_WINDOW_S:
                window.popleft()

    def path_gbps(self, server: str | None, path: str, direction: str) -> float | None:
        """GB/s an engine path moved over the last RATE_WINDOW_S, from its byte counter (the engine's own
        rate is of the moment it was read, 0 between copies); None before two samples."""
        window = self._moved.get((server, path, direction))
        if not window or len(window) < 2 or window[-1][0] <= window[0][0]:
            return None
        (t0, b0), (t1, b1) = window[0], window[-1]
        return (b1 - b0) / (t1 - t0) / 1e9

    def _track_cpu(self, snap: Snapshot) -> None:
        now: dict[str, float] = {}
        for p in snap.processes:  # a server's processes, by its name
            if p.cpu_pct is not None:
                now[p.name] = now.get(p.name, 0.0) + p.cpu_pct
        for name in set(self._cpu) | set(now):
            window = self._cpu.setdefault(name, deque())
            if name in now:
                window.append((snap.ts, now[name]))
            while window and window[0][0] < snap.ts - DEMO_CPU_WINDOW_S:
                window.popleft()

    def demo_running(self) -> bool:
        """Whether the embedded demo's server runs (any state but stopped, crashed or gone)."""
        snap = self.latest
        row = next((s for s in (snap.servers if snap else ()) if s.server == self.demo), None)
        return self.demo is not None and row is not None and row.state.running

    def demo_cpu(self) -> float | None:
        """Percent of one core the demo's llama-server took over the last DEMO_CPU_WINDOW_S (None: no sample)."""
        window = self._cpu.get(self.demo or "")
        return sum(c for _, c in window) / len(window) if window else None

    def tokens_per_s(self, server: str) -> float | None:
        """Generated tokens/s over the last RATE_WINDOW_S while ready; None when there is no sample."""
        window = self._rates.get(server)
        return sum(v for _, v in window) / len(window) if window else None

    def ingest(self, snap: Snapshot) -> None:
        """Fold one snapshot in: latest values replace, series and logs append."""
        self.latest = snap
        self.ticks += 1
        for g in snap.gpus:
            tx, rx = self.link_history.setdefault(g.index, (deque(maxlen=HISTORY_TICKS),
                                                            deque(maxlen=HISTORY_TICKS)))
            link = link_status(g)
            tx.append(link.tx_fraction or 0.0)
            rx.append(link.rx_fraction or 0.0)
            util, mem = self.use_history.setdefault(g.index, (deque(maxlen=HISTORY_TICKS),
                                                              deque(maxlen=HISTORY_TICKS)))
            util.append((g.util_pct or 0.0) / 100)
            mem.append(g.mem_used / g.mem_total if g.mem_used is not None and g.mem_total else 0.0)
        for s in snap.servers:
            self._track_rate(s.server, s.state, s.ts, s.tokens_per_s)
        self._track_moved(snap)
        self._track_cpu(snap)
        self.requests.extend(snap.requests)
        self.events.extend(snap.events)
        for e in snap.events:  # replayed changes move the knobs and specs the views show
            self._apply_change(e)
            if e.kind in GPU_FAULT_KINDS and e.target.removeprefix("GPU").isdigit():
                self.faults[int(e.target.removeprefix("GPU"))] = e
        self.update_warnings()

    def update_warnings(self) -> None:
        """Share warnings for the latest tick and the current specs (see shares.share_warnings)."""
        snap = self.latest
        if snap is None:
            return
        found = share_warnings(snap, list(self.specs.values()))
        started = {e.target for e in snap.events if e.kind in ("server.start", "server.restart") and e.ok}
        for name in started:
            self._start_warnings[name] = tuple(w for w in found if w.kind == "low_free_at_start"
                                               and name in w.servers)
        sticky = tuple(w for ws in self._start_warnings.values() for w in ws)
        self.warnings = tuple(w for w in found if w.kind != "low_free_at_start") + sticky

    def runs_on_cpu(self, server: str) -> bool:
        """Whether the server's build cannot use GPUs (splits, shares and -ngl do nothing there): its binary
        is a CPU build, or its log said so."""
        return server in self.cpu_builds or any(says_no_gpu_offload(w) for w in self.server_warnings.get(server, ()))

    def cpu_evidence(self, server: str) -> str:
        """How runs_on_cpu knows: the server's log line, else its binary."""
        said = next((w for w in self.server_warnings.get(server, ()) if says_no_gpu_offload(w)), None)
        return f"its log: {said}" if said else f"{self.cpu_builds.get(server, 'its llama-server')} is a CPU build"

    def _apply_change(self, e: Event) -> None:
        if not e.ok:
            return
        if e.kind in ("server.start", "server.restart"):  # a new process: its own warnings
            self.server_warnings.pop(e.target, None)
        elif e.kind == "server.warning":
            self.server_warnings[e.target] = (*self.server_warnings.get(e.target, ()), str(e.new))
        if e.kind == "engine.knobs" and isinstance(e.new, dict):
            self.knobs = {**self.knobs, **e.new}
        elif e.kind in ("server.split", "server.share") and e.target in self.specs:
            spec = self.specs[e.target]
            update = spec.with_split(e.new) if e.kind == "server.split" else {"share": e.new}
            self.specs = {**self.specs, e.target: spec.model_copy(update=update)}

    def ingest_all(self, snaps: Iterable[Snapshot]) -> None:
        for s in snaps:
            self.ingest(s)
