"""Table views: Split balance, Servers (+ log tail), Engine, Pools, History, Events."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any, Iterable, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Region
from textual.widgets import Log, Static

from gpudash.advisor.planner import SplitPlan
from gpudash.config import ServerSpec
from gpudash.labels import is_sim_label
from gpudash.records import Event, PoolSample, PoolShardSample
from gpudash.tui.state import ViewState, recommend_split, runs_plan, split_balance, split_servers
from gpudash.tui.widgets.fitted import FittedTable, NamesHiddenColumns, hidden_columns_line
from gpudash import fmt


class TableView(NamesHiddenColumns, Vertical):
    """A title line, an empty-state line and one FittedTable that is refilled from the view state; the
    columns of DROP give way, in that order, when the rows are wider than the screen."""

    COLUMNS: tuple[str, ...] = ()
    DROP: tuple[str, ...] = ()
    SQUEEZE: dict[str, int] = {}
    TITLE = ""
    EMPTY = "nothing yet"

    def compose(self) -> ComposeResult:
        yield Static(self.TITLE, classes="view-title")
        yield Static(self.EMPTY, classes="empty")
        yield FittedTable(self.COLUMNS, self.DROP, self.SQUEEZE)
        yield hidden_columns_line()

    @property
    def table(self) -> FittedTable:
        return self.query_one(FittedTable)

    def fill(self, rows: Sequence[Sequence[Any]], cursor: int | None = None) -> None:
        """Refill the table, but only when the rows changed (refilling is the costly part of a tick)."""
        t = self.table
        t.set_rows(rows)
        self.query_one(".empty", Static).display = not rows
        if cursor is not None and rows:
            t.move_cursor(row=max(0, min(cursor, len(rows) - 1)), animate=False)


class SplitView(TableView):
    TITLE = "Split balance: target ratio beside the memory each GPU holds, and the planner's split (p: apply)"
    EMPTY = "no model is split across GPUs (set gpus / tensor_split in a [[servers]] entry)"
    COLUMNS = ("server", "GPU", "target", "held", "actual", "imbalance", "planned")

    def compose(self) -> ComposeResult:
        yield from super().compose()
        yield Static("", id="split-advice")
        yield Static("", id="share-warnings")

    def update_view(self, state: ViewState, selected_server: str | None) -> None:
        snap = state.latest
        rows: list[tuple[Any, ...]] = []
        advice = Text()
        if snap is not None:
            for spec in split_servers(state.specs.values(), len(snap.gpus)):
                plan = recommend_split(spec, snap, state.model_bytes.get(spec.name))
                planned = {s.index: s.ratio for s in plan.shares} if not isinstance(plan, str) else {}
                for r in split_balance(spec, snap):
                    imb = Text("—") if r.imbalance is None else Text(
                        f"{r.imbalance * 100:+.1f} pts", style="bold red" if abs(r.imbalance) > 0.05 else "green")
                    name = Text(r.server, style="bold reverse" if r.server == selected_server else "")
                    rows.append((name, r.gpu, fmt.pct(r.target, 1), fmt.size(r.held_bytes),
                                 fmt.pct(r.actual, 1), imb, fmt.pct(planned.get(r.gpu), 1)))
                advice.append_text(_advice_line(spec, plan))
        self.fill(rows)
        self.query_one("#split-advice", Static).update(advice, layout=False)
        self.query_one("#share-warnings", Static).update(warnings_text(state.warnings))


def _advice_line(spec: ServerSpec, plan: SplitPlan | str) -> Text:
    """'big: -ts 1,1 now, planner -ts 2,3 (p: apply): why' - one line per split server."""
    now = ",".join(f"{r:g}" for r in spec.tensor_split) if spec.tensor_split else "equal"
    t = Text(f"{spec.name}: -ts {now} now, ", style="bold")
    if isinstance(plan, str):
        t.append(plan, style="yellow")
    else:
        same = runs_plan(spec, plan)
        t.append(f"planner -ts {plan.ts}", style="bold green" if same else "bold magenta")
        t.append(" (already applied)" if same else " (p: apply)")
        t.append(f": {plan.reason}")
    t.append("\n")
    return t


def warnings_text(warnings: Sequence[Any]) -> Text:
    """The share warnings, one per line, in a warning colour (or a quiet line when there are none)."""
    if not warnings:
        return Text("share warnings: none", style="dim")
    t = Text(f"share warnings ({len(warnings)}):\n", style="bold yellow")
    t.append("\n".join(f"  ! {w.message}" for w in warnings), style="yellow")
    return t


class ServersView(NamesHiddenColumns, Vertical):
    """The launcher's servers, and the log tail of the selected one."""

    COLUMNS = ("server", "kind", "state", "port", "uptime", "tok/s 10s", "prefill tok/s", "crashes",
               "relaunches", "running",
               "KV use")
    # At 80 columns: server, state, uptime, rates, crashes and KV use stay.
    DROP = ("kind", "port", "running", "relaunches", "prefill tok/s", "uptime")

    def compose(self) -> ComposeResult:
        yield Static("Servers", classes="view-title", id="servers-title")
        yield Static("no servers yet (the launcher starts them one after another)", classes="empty")
        yield FittedTable(self.COLUMNS, self.DROP, id="servers-table")
        yield hidden_columns_line()
        yield Static("", id="sleep-times")
        yield Static("log: no server selected", id="log-title", classes="view-title")
        log = Log(id="server-log", max_lines=200)
        log.can_focus = False
        yield log

    def update_view(self, state: ViewState, selected_server: str | None) -> None:
        snap = state.latest
        servers = snap.servers if snap is not None else ()
        names = [s.server for s in servers] or list(state.specs)
        table = self.query_one(FittedTable)
        by_name = {s.server: s for s in servers}
        rows: list[tuple[Any, ...]] = []
        for name in names:
            s = by_name.get(name)
            if s is None:
                spec = state.specs[name]
                rows.append((name, spec.kind, "not started", spec.port or "—", "—", "—", "—", 0, 0, "—", "—"))
                continue
            style = {"ready": "green", "crashed": "bold red", "backoff": "yellow", "sleeping": "cyan",
                     "relaunching": "bold magenta"}.get(s.state, "")
            ready = s.state == "ready"  # only a serving server has rates; anything else would be stale
            kv = "not reported" if ready and s.kv_cache_usage is None else fmt.pct(s.kv_cache_usage if ready else None)
            rows.append((name, s.kind, Text(s.state, style=style), s.port or "—",
                         fmt.duration(s.uptime_s if ready else None), fmt.num(state.tokens_per_s(name), ".1f"),
                         fmt.num(s.prompt_tokens_per_s if ready else None, ".1f"), s.restarts, s.relaunches,
                         fmt.num(s.requests_running if ready else None, ".0f"), kv))
        table.set_rows(rows)
        self.query_one(".empty", Static).display = not names
        self.query_one("#sleep-times", Static).update(_sleep_times(state.events))
        title = Text("Servers")
        if selected_server in names:
            title.append("  selected: ")
            title.append(f" {selected_server} ", style="bold reverse")
            title.append("  (s: next; S/x/R start/stop/restart it)")
        self.query_one("#servers-title", Static).update(title)
        if selected_server in names:
            table.move_cursor(row=names.index(selected_server), animate=False)

    def show_log(self, server: str, lines: list[str]) -> None:
        self.query_one("#log-title", Static).update(f"log: {server} (last {len(lines)} lines)")
        log = self.query_one(Log)
        log.clear()
        log.write_lines(lines)


def _sleep_times(events: Any) -> str:
    """The latest timed sleep and wake of each server (from server.sleep / server.wake events)."""
    last: dict[tuple[str, str], Any] = {}
    for e in events:
        if e.kind in ("server.sleep", "server.wake") and e.ok and isinstance(e.new, dict):
            last[(e.target, e.kind)] = e
    verb = {"server.sleep": "slept in", "server.wake": "woke in"}
    parts = [f"{server} {verb[kind]} {e.new.get('seconds', 0):.2f} s" for (server, kind), e in sorted(last.items())]
    return ("sleep/wake: " + ", ".join(parts)) if parts else ""


class EngineView(NamesHiddenColumns, Vertical):
    """Transfer-engine paths (bytes, GB/s, queue depth, chunks) and the live knobs."""

    COLUMNS = ("path", "dir", "GPU", "via", "bytes", "GB/s", "queue", "chunks", "CPU s")
    DROP = ("CPU s", "chunks")  # a preloaded server's paths carry its name
    SHOWN = 24  # rows that fit at 120x40; an 8-GPU rig has 128 path/direction pairs

    def compose(self) -> ComposeResult:
        yield Static("Engine paths (k: edit knobs)", classes="view-title")
        yield Static("no engine paths reported yet", classes="empty")
        yield FittedTable(self.COLUMNS, self.DROP, id="engine-table")
        yield hidden_columns_line()
        yield Static("knobs: —", id="knobs")

    def update_view(self, state: ViewState, unsaved: dict[str, Any] | None = None, config: Any = None) -> None:
        snap = state.latest
        paths = snap.engine_paths if snap is not None else ()
        busy = sorted((p for p in paths if p.bytes_total or p.queue_depth),
                      key=lambda p: (-p.gbps, -p.bytes_total, p.path))
        rows = [(f"{p.server}/{p.path}" if p.server else p.path, p.direction, p.gpu, "—" if p.via is None else p.via, fmt.size(p.bytes_total),
                 f"{p.gbps:.2f}", p.queue_depth, p.chunks_total, f"{p.cpu_s:.2f}") for p in busy[: self.SHOWN]]
        self.query_one(FittedTable).set_rows(rows)  # refilled only when they changed: the costly part of a tick
        empty = self.query_one(".empty", Static)
        empty.display = not rows
        if not rows:
            empty.update(f"{len(paths)} engine paths, none has moved bytes yet" if paths
                         else "no engine paths reported yet")
        total = sum(p.gbps for p in paths)
        knobs = "  ".join(f"{k}={fmt.knob(v)}" for k, v in state.knobs.items()) or "—"
        text = Text(f"{len(busy)} of {len(paths)} paths active (busiest first), {total:.2f} GB/s in all\n"
                    f"knobs: {knobs}")
        if unsaved:
            text.append(f"\nNOT SAVED: {', '.join(unsaved)} changed in this run only; w saves them into "
                        f"{config or 'the config file'}", style="bold yellow")
        self.query_one("#knobs", Static).update(text)


class PoolsView(TableView):
    TITLE = "Memory pools: shards (up/down: select, m: resize the selected shard)"
    EMPTY = "no memory pools yet (pools appear once the engine or a server creates them)"
    # Fits 80 columns: free is size minus used, so only its largest block and their count are shown.
    COLUMNS = ("pool", "shard", "size", "used", "max free", "free blocks", "frag", "fails")
    _selected_pool: str | None = None  # whose slab line was last scrolled into sight

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if isinstance(widget, FittedTable):  # each pool's slab line sits right above its shards
                with VerticalScroll(id="pool-slabs-box"):
                    yield Static("", id="pool-slabs")
            yield widget

    def update_view(self, state: ViewState, cursor: int = 0) -> None:
        snap = state.latest
        pools = snap.pools if snap is not None else ()
        shards = snap.pool_shards if snap is not None else ()
        self.fill([(s.pool, s.shard, fmt.size(s.capacity), fmt.size(s.used), fmt.size(s.largest_free),
                    s.free_blocks, fmt.pct(s.fragmentation, 1), s.failures)
                   for s in shards], cursor)
        box = self.query_one("#pool-slabs-box", VerticalScroll)
        box.display = bool(pools or shards)
        selected = shards[min(cursor, len(shards) - 1)].pool if shards else None
        lines, at = slab_lines(pools, shards, selected)
        self.query_one("#pool-slabs", Static).update(lines)
        if at is not None and selected != self._selected_pool:  # more pools than lines: follow the selection
            box.call_after_refresh(box.scroll_to_region, Region(0, at, 1, 1), animate=False)
        self._selected_pool = selected


def slab_lines(pools: Sequence[PoolSample], shards: Sequence[PoolShardSample],
               selected: str | None) -> tuple[Text, int | None]:
    """'sim-gpu0: slab 8.0 GiB · 2 shards · 1.0 GiB unassigned', a line per pool, the `selected` one bold,
    and that line's index. A recording made before slabs were sampled has shard rows only: its slab and
    unassigned show as NA."""
    count = Counter(s.pool for s in shards)
    slab = {p.pool: p for p in pools}
    names = list(dict.fromkeys([*slab, *count]))
    lines = []
    for name in names:
        size, unassigned = (slab[name].slab, slab[name].unassigned) if name in slab else (None, None)
        n = count[name]
        lines.append(Text(f"{name}: slab {fmt.size(size)} · {n} shard{'' if n == 1 else 's'} · "
                          f"{fmt.size(unassigned)} unassigned", style="bold" if name == selected else ""))
    return Text("\n").join(lines), names.index(selected) if selected in names else None


class HistoryView(TableView):
    TITLE = "Recorded sessions (e: export the selected one, up/down: select)"
    EMPTY = "no recorded sessions in this DB"
    COLUMNS = ("id", "started", "ended", "duration", "source", "what", "rows")
    DROP = ("ended", "rows", "what")  # the source stays: it says SIM

    def show_sessions(self, sessions: Iterable[Any], cursor: int) -> None:
        """`what` is the session's note: which command recorded it (gpudash record, bench engine...)."""
        rows = [(s.id, _clock(s.started), _clock(s.ended), fmt.duration(s.duration_s),
                 Text(s.source, style="bold yellow" if is_sim_label(s.source) else ""), s.note or fmt.NA,
                 sum(s.rows.values()))
                for s in sessions]
        self.fill(rows, cursor)


def _clock(ts: float | None) -> str:
    return "—" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def event_row(e: Event) -> tuple[Any, ...]:
    status = Text("ok", style="green") if e.ok else Text("refused", style="bold red")
    return (time.strftime("%H:%M:%S", time.localtime(e.ts)), e.actor, e.kind, e.target,
            _short(e.old), _short(e.new), status, e.reason or "")


def _short(v: Any) -> str:
    if v is None:
        return "—"
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= 40 else s[:39] + "…"


class EventsView(TableView):
    TITLE = "Events: every change and launcher happening, newest first"
    EMPTY = "no events yet"
    COLUMNS = ("time", "actor", "kind", "target", "old", "new", "status", "reason")
    DROP = ("actor",)  # old and new are what an event says: they stay (narrowed), the reason is cut at the edge
    SQUEEZE = {"old": 12, "new": 16}
    SHOWN = 200

    def update_view(self, state: ViewState) -> None:
        events = list(state.events)[-self.SHOWN:]
        self.fill([event_row(e) for e in reversed(events)])
