"""Table views: Engine, Pools, History, Events (Split and Servers are in servers.py)."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import Static

from gpudash.records import Event, PoolSample, PoolShardSample
from gpudash.tui import messages as msg
from gpudash.tui.state import RATE_WINDOW_S, ViewState
from gpudash.tui.widgets.fitted import FittedTable, NamesHiddenColumns, hidden_columns_line
from gpudash.tui.widgets.view import DashView
from gpudash import fmt
from gpudash.outside import printable

ASKED_BY = ("keyboard", "cli")  # the actors of changes someone asked for (runtime/control.py's `actor`)


class TableView(NamesHiddenColumns, DashView):
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


class EngineView(NamesHiddenColumns, DashView):
    """Transfer-engine paths (bytes, GB/s moved over the last seconds, queue depth, chunks) and the live knobs."""

    COLUMNS = ("path", "dir", "GPU", "via", "bytes", "GB/s", "queue", "chunks", "CPU s")
    DROP = ("CPU s", "chunks")  # a preloaded server's paths carry its name
    SHOWN = 24  # rows that fit at 120x40; an 8-GPU rig has 128 path/direction pairs

    def compose(self) -> ComposeResult:
        yield Static("Engine paths (k: edit knobs)", classes="view-title")
        yield Static("no engine paths reported yet", classes="empty")
        yield FittedTable(self.COLUMNS, self.DROP, id="engine-table")
        yield hidden_columns_line()
        yield Static("knobs: —", id="knobs")

    def draw(self, state: ViewState) -> None:
        snap = state.latest
        paths = snap.engine_paths if snap is not None else ()
        rate = {p: state.path_gbps(p.server, p.path, p.direction) for p in paths}  # moved over the last seconds
        busy = sorted((p for p in paths if p.bytes_total or p.queue_depth),
                      key=lambda p: (-(rate[p] or 0.0), -p.bytes_total, p.path))
        rows = [(f"{p.server}/{p.path}" if p.server else p.path, p.direction, p.gpu, "—" if p.via is None else p.via,
                 fmt.size(p.bytes_total), fmt.num(rate[p], ".2f"), p.queue_depth, p.chunks_total, f"{p.cpu_s:.2f}")
                for p in busy[: self.SHOWN]]
        self.query_one(FittedTable).set_rows(rows)  # refilled only when they changed: the costly part of a tick
        empty = self.query_one(".empty", Static)
        empty.display = not rows
        if not rows:
            empty.update(f"{len(paths)} engine paths, none has moved bytes yet" if paths
                         else "no engine paths reported yet")
        total = sum(r for r in rate.values() if r is not None)
        # spelled as the knob form and the config file take them (2.81MB, 16MiB): one unit on every screen
        knobs = "  ".join(f"{k}={fmt.knob(v)}" for k, v in state.knobs.items()) or "—"
        text = Text(f"{len(busy)} of {len(paths)} paths active (busiest first), {total:.2f} GB/s in all over "
                    f"the last {RATE_WINDOW_S:g} s\n"
                    f"knobs: {knobs}")
        unsaved = state.unsaved_knobs()
        if unsaved:
            text.append(f"\nNOT SAVED: {', '.join(unsaved)} changed in this run only; w saves them into "
                        f"{state.config_path or 'the config file'}", style="bold yellow")
        self.query_one("#knobs", Static).update(text)

    def action_save_knobs(self) -> None:
        """`w`: write the changed knobs into the config's [engine] section, so the next start has them."""
        changed = self.state.unsaved_knobs()
        if not changed:
            self.notify("the engine knobs match the config file: nothing to save")
            return
        path = self.state.config_path
        if path is None:
            self.notify("no config file to save into (this run was started without one)", severity="warning")
            return

        def save() -> None:
            from gpudash.config import ConfigError, save_engine_knobs

            try:
                save_engine_knobs(path, changed)
            except (ConfigError, OSError, ValueError) as err:
                self.post_message(msg.KnobsSaved(False, f"cannot save the knobs into {path}: {err}", changed))
                return
            self.post_message(msg.KnobsSaved(True, f"saved {', '.join(changed)} into [engine] of {path}", changed))

        self.run_in_thread(save, "config.save_knobs", "config")

    def on_knobs_saved(self, message: msg.KnobsSaved) -> None:
        message.stop()
        if message.ok and self.state.saved_knobs is not None:
            self.state.saved_knobs.update(message.knobs)
        self.notify(message.text, severity="information" if message.ok else "error", timeout=8)
        self.show(self.state)


class PoolsView(TableView):
    TITLE = "Memory pools: shards (up/down: select, m: resize the selected shard)"
    EMPTY = "no memory pools yet (pools appear once the engine or a server creates them)"
    # Fits 80 columns: free is size minus used, so only its largest block and their count are shown.
    COLUMNS = ("pool", "shard", "size", "used", "max free", "free blocks", "frag", "fails")
    _selected_pool: str | None = None  # whose slab line was last scrolled into sight
    cursor = 0  # the selected shard

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if isinstance(widget, FittedTable):  # each pool's slab line sits right above its shards
                with VerticalScroll(id="pool-slabs-box"):
                    yield Static("", id="pool-slabs")
            yield widget

    def draw(self, state: ViewState) -> None:
        snap = state.latest
        pools = snap.pools if snap is not None else ()
        shards = snap.pool_shards if snap is not None else ()
        cursor = self.cursor
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

    def _shards(self) -> tuple[PoolShardSample, ...]:
        return self.state.latest.pool_shards if self.state.latest else ()

    def action_select(self, step: int) -> None:
        shards = self._shards()
        if shards:
            self.cursor = (self.cursor + step) % len(shards)
            self.show(self.state)

    def action_edit_shard(self) -> None:
        """`m`: the selected shard's size."""
        from gpudash.tui.screens.forms import ShardForm

        shards = self._shards()
        if not shards:
            self.notify("no memory pools yet", severity="warning")
            return
        s = shards[min(self.cursor, len(shards) - 1)]
        slab = next((p for p in self.state.latest.pools if p.pool == s.pool), None)
        self.app.push_screen(ShardForm(s.pool, s.shard, s.capacity, slab.unassigned if slab else None, s.used or 0),
                             self.propose)


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


def event_row(e: Event) -> tuple[Any, ...]:
    """An event's cells; its target, values and reason may quote outside text (a server's error body), shown
    as text (outside.printable)."""
    status = Text(event_status(e), style="green" if e.ok else "bold red")
    return (time.strftime("%H:%M:%S", time.localtime(e.ts)), e.actor, e.kind, printable(e.target), status,
            _short(e.old), _short(e.new), printable(e.reason or ""))


def event_status(e: Event) -> str:
    """ok; `refused` for a change someone asked for (keys, the CLI) that was not made; `failed` for what
    gpudash, a server or a build did not manage."""
    return "ok" if e.ok else "refused" if e.actor in ASKED_BY else "failed"


def event_value(v: Any) -> str:
    """An event's old or new value in words: a dict of knobs as name=value with sizes in binary units
    (16 MiB, like every size on screen, where the raw JSON said 16777216)."""
    if v is None:
        return fmt.NA
    if isinstance(v, dict):
        return printable(", ".join(f"{k}={fmt.knob_text(x)}" for k, x in v.items()))
    return printable(v if isinstance(v, str) else json.dumps(v, default=str))


def _short(v: Any) -> str:
    s = event_value(v)
    return s if len(s) <= 40 else s[:39] + "…"


def event_text(e: Event) -> Text:
    """One event in full, for the line under the table (the table cuts long values and reasons)."""
    t = Text(f"{time.strftime('%H:%M:%S', time.localtime(e.ts))} {e.actor} {e.kind} {printable(e.target)}: ",
             style="bold")
    t.append(f"{event_value(e.old)} -> {event_value(e.new)}")
    t.append(f"  {event_status(e)}", style="green" if e.ok else "bold red")
    if e.reason:
        t.append(f": {printable(e.reason)}")
    return t


class EventsView(TableView):
    TITLE = "Events: every change and launcher happening, newest first (up/down: select)"
    EMPTY = "no events yet"
    COLUMNS = ("time", "actor", "kind", "target", "status", "old", "new", "reason")  # status never off the edge
    DROP = ("actor",)  # old and new are what an event says: they stay (narrowed), the reason is cut at the edge
    SQUEEZE = {"old": 12, "new": 16}
    SHOWN = 200
    CUT_HINT = "the selected event is in full below"

    cursor = 0  # rows from the newest
    _shown: list[Event] = []

    def compose(self) -> ComposeResult:
        yield from super().compose()
        yield Static("", id="event-detail")

    def draw(self, state: ViewState) -> None:
        events = list(reversed(list(state.events)[-self.SHOWN:]))
        self._shown = events
        self.cursor = min(self.cursor, max(0, len(events) - 1))
        self.fill([event_row(e) for e in events], self.cursor)
        self.query_one("#event-detail", Static).update(event_text(events[self.cursor]) if events else "")

    def action_select(self, step: int) -> None:
        if self._shown:
            self.cursor = (self.cursor + step) % len(self._shown)
            self.show(self.state)
