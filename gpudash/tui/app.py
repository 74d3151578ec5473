"""The gpudash Textual app: views over snapshots from an injected feed (live rig or recorded session),
and keyboard-driven changes that all go through `gpudash.control.Controller.apply`.

Threads never touch widgets: the sampler's sink queues snapshots and posts one mergeable message;
every blocking call (starting the feed, applying a change, reading logs or the store, exporting) is a
named thread worker that posts typed messages, with one handler for worker errors. Timed polls are
chains (fetch -> render -> set_timer), never intervals that could overlap.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Iterable

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from gpudash.control import Command, ServerAction, SetRecording, SetSplit, describe, relaunches
from gpudash.records import Event, Snapshot
from gpudash.tui import messages as msg
from gpudash.tui.feeds import Feed, FeedInfo, Player
from gpudash.tui.replay_controls import ReplayControls
from gpudash.tui.state import ViewState, recommend_split, runs_plan, split_servers, ts_ratios
from gpudash.tui.widgets.header import SourceHeader
from gpudash.tui.widgets.latency import LatencyView
from gpudash.tui.widgets.overview import OverviewView
from gpudash.tui.widgets.tables import (EngineView, EventsView, HistoryView, PoolsView, ServersView,
                                        SplitView)

VIEWS = ("overview", "split", "servers", "latency", "engine", "pools", "history", "events")
VIEW_NAMES = ("Overview", "Split balance", "Servers", "Latency", "Engine", "Pools", "History", "Events")
VIEW_WIDGETS = (OverviewView, SplitView, ServersView, LatencyView, EngineView, PoolsView, HistoryView, EventsView)
MAX_PENDING = 256  # snapshots waiting for the UI; older ones are folded into newer ones beyond this
LOG_POLL_S = 1.0
REPLAY_ONLY = {"replay_pause", "replay_step", "replay_back", "replay_forward", "replay_slower", "replay_faster"}
LIVE_ONLY = {"edit_split", "apply_plan", "edit_share", "edit_knobs", "apply", "server_start", "server_stop",
             "server_restart", "server_sleep", "server_wake", "toggle_recording"}


def _bindings() -> list[Binding]:
    views = [Binding(str(i + 1), f"show_view('{v}')", n, id=f"view_{v}", show=False)
             for i, (v, n) in enumerate(zip(VIEWS, VIEW_NAMES))]
    return views + [
        Binding("down", "select(1)", "Select next", id="select_next", show=False),
        Binding("up", "select(-1)", "Select previous", id="select_previous", show=False),
        Binding("g", "select_gpu", "Next GPU", id="select_gpu", show=False),
        Binding("s", "select_server", "Next server", id="select_server", show=False),
        Binding("t", "edit_split", "Split ratios", id="edit_split"),
        Binding("p", "apply_plan", "Apply planned split", id="apply_plan"),
        Binding("m", "edit_share", "Memory share / shard size", id="edit_share", show=False),
        Binding("k", "edit_knobs", "Engine knobs", id="edit_knobs"),
        Binding("a", "apply", "Apply", id="apply"),
        Binding("S", "server('start')", "Start server", id="server_start", show=False),
        Binding("x", "server('stop')", "Stop server", id="server_stop", show=False),
        Binding("R", "server('restart')", "Restart server", id="server_restart", show=False),
        Binding("z", "server('sleep')", "Sleep server (vLLM)", id="server_sleep", show=False),
        Binding("w", "server('wake')", "Wake server (vLLM)", id="server_wake", show=False),
        Binding("r", "toggle_recording", "Recording", id="toggle_recording"),
        Binding("e", "export", "Export session", id="export", show=False),
        Binding("space", "replay_pause", "Pause/play", id="replay_pause"),
        Binding("full_stop", "replay_step", "Step one tick", id="replay_step"),
        Binding("left_square_bracket", "replay_seek(-1)", "Seek back", id="replay_back"),
        Binding("right_square_bracket", "replay_seek(1)", "Seek forward", id="replay_forward"),
        Binding("minus", "replay_speed(False)", "Slower", id="replay_slower", show=False),
        Binding("plus,equals_sign", "replay_speed(True)", "Faster", id="replay_faster", show=False),
        Binding("question_mark", "help", "Help", id="help"),
        Binding("q", "quit", "Quit", id="quit"),
    ]


ACTION_IDS: dict[str, set[str]] = {}
for _b in _bindings():
    ACTION_IDS.setdefault(_b.action.split("(")[0], set()).add(_b.id or "")


class GpudashApp(ReplayControls, App[None]):
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "gpudash"
    ENABLE_COMMAND_PALETTE = True
    AUTO_FOCUS = None  # a focused widget inside a tab would switch the view when a modal closes
    BINDINGS = _bindings()

    def __init__(self, feed: Feed, *, replay: bool = False, speed: float = 1.0, keys: dict[str, str] | None = None,
                 export_dir: Path | None = None) -> None:
        super().__init__()
        self.animation_level = "none"  # a view switch shows at once; no 60 fps tab-underline animation
        self.feed = feed
        self.replay = replay
        self.keys = dict(keys or {})
        self.export_dir = export_dir or Path.cwd()
        self.state = ViewState()
        self.info: FeedInfo | None = None
        self.player: Player | None = None
        self._speed = speed
        self._pending: deque[Snapshot] = deque()
        self._pending_lock = threading.Lock()
        self.pending_command: Command | None = None
        self.selected_gpu = 0
        self.selected_server: str | None = None
        self.sessions: list[Any] = []
        self.session_cursor = 0
        self.shard_cursor = 0
        self.first_frame_at: float | None = None
        self._log_chain = False
        self._feed_closed = False
        self._feed_close_lock = threading.Lock()

    # ---- layout --------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield SourceHeader(id="header")
        with TabbedContent(id="views", initial="overview"):
            for view, name, widget in zip(VIEWS, VIEW_NAMES, VIEW_WIDGETS):
                with TabPane(name, id=view):
                    yield widget(id=f"{view}-view")
        yield Footer()

    def on_mount(self) -> None:
        if self.keys:
            self.set_keymap(self.keys)
        self.header.source = "replay: loading…" if self.replay else f"{self.feed.source} (starting…)"
        self.header.rig = "" if self.replay else self.feed.source
        for tabs in self.query("Tabs"):
            tabs.can_focus = False
        self.call_after_refresh(self._after_first_frame)

    def _after_first_frame(self) -> None:
        """Sampling (or loading the recording) starts only once the first frame is on screen."""
        self.first_frame_at = time.perf_counter()
        self.run_worker(self._start_feed, name="feed.start", thread=True, exit_on_error=False)

    @property
    def header(self) -> SourceHeader:
        return self.query_one(SourceHeader)

    @property
    def active_view(self) -> str:
        return self.query_one(TabbedContent).active or "overview"

    def _alive(self) -> bool:
        """False once the app is shutting down and its widgets are gone: timers and queued messages
        (a snapshot, the log-tail chain) can still fire then, and must not query the DOM."""
        return bool(self.query(TabbedContent))

    # ---- the feed ------------------------------------------------------------------------------------

    def _start_feed(self) -> None:
        info = self.feed.start(self._deliver)
        # Move everything start-up made (modules, the DOM and its CSS, config models, the rig) out of the
        # cyclic collector's reach: otherwise every full collection walks it all, 70-100 ms with the
        # UI thread stopped, and those pauses were the key-latency tail (bench_tui p95).
        gc.collect()
        gc.freeze()
        self.post_message(msg.FeedStarted(info))
        problems = self.feed.start_servers()  # health-gated and slow: the views are already live
        controller = info.controller
        self.post_message(msg.SpecsChanged(controller.specs() if controller is not None else dict(info.specs)))
        for text in problems:
            self.post_message(msg.Problem("servers.start", text))

    def _deliver(self, snap: Snapshot) -> None:
        """Sampler sink (sampler thread): queue the snapshot and post one mergeable wake-up message."""
        with self._pending_lock:
            if len(self._pending) >= MAX_PENDING:  # the UI fell behind: fold the oldest into the next
                old = self._pending.popleft()
                nxt = self._pending.popleft()
                self._pending.appendleft(replace(nxt, events=old.events + nxt.events,
                                                 requests=old.requests + nxt.requests))
            self._pending.append(snap)
        self.post_message(msg.SnapshotsPending())

    def on_feed_started(self, message: msg.FeedStarted) -> None:
        info: FeedInfo = message.info
        self.info = info
        self.state.specs = dict(info.specs)
        self.state.knobs = dict(info.knobs)
        self.state.update_warnings()
        self._read_model_sizes()
        if not self._alive():
            return
        h = self.header
        h.source, h.rig, h.db_path, h.recording = info.source, info.rig, info.db_path or "—", info.recording
        if self.selected_server is None and info.specs:
            self.selected_server = next(iter(info.specs))
        for note in info.notes:
            self.notify(note, severity="warning", timeout=10)
        if self.replay:
            self.player = Player(info.snapshots, self._speed)
            self._replay_tick()
        self.refresh_bindings()
        self.refresh_views()

    def on_snapshots_pending(self, message: msg.SnapshotsPending) -> None:
        with self._pending_lock:
            snaps = list(self._pending)
            self._pending.clear()
        if not snaps:
            return
        self.state.ingest_all(snaps)
        if self.selected_server is None and snaps[-1].servers:
            self.selected_server = snaps[-1].servers[0].server
        self.refresh_views()

    def on_specs_changed(self, message: msg.SpecsChanged) -> None:
        self.state.specs = dict(message.specs)
        self.state.update_warnings()
        self._read_model_sizes()
        self.refresh_views()

    def _read_model_sizes(self) -> None:
        """The split planner sizes a model by its file: stat the files in a worker (a slow disk or a
        network mount never stalls the UI)."""
        specs = list(self.state.specs.values())

        def read() -> None:
            sizes = {}
            for spec in specs:
                p = Path(spec.model).expanduser()
                if p.is_file():
                    sizes[spec.name] = p.stat().st_size
            self.post_message(msg.ModelSizes(sizes))

        self._worker(read, "split.model_sizes", "models")

    def on_model_sizes(self, message: msg.ModelSizes) -> None:
        self.state.model_bytes = dict(message.sizes)
        self.refresh_views()

    def on_knobs_changed(self, message: msg.KnobsChanged) -> None:
        self.state.knobs = dict(message.knobs)
        self.refresh_views()

    # ---- rendering -----------------------------------------------------------------------------------

    def refresh_views(self) -> None:
        """Redraw only the view on screen (the others redraw when shown)."""
        if not self._alive():
            return
        self.header.warnings = len(self.state.warnings)
        view = self.active_view
        if view == "overview":
            self.query_one(OverviewView).update_view(self.state, self.selected_gpu)
        elif view == "split":
            self.query_one(SplitView).update_view(self.state, self.selected_server)
        elif view == "servers":
            self.query_one(ServersView).update_view(self.state, self.selected_server)
        elif view == "latency":
            self.query_one(LatencyView).update_view(self.state)
        elif view == "engine":
            self.query_one(EngineView).update_view(self.state)
        elif view == "pools":
            self.query_one(PoolsView).update_view(self.state, self.shard_cursor)
        elif view == "events":
            self.query_one(EventsView).update_view(self.state)
        if self.player is not None:
            p = self.player
            self.header.position = (f"tick {p.index + 1}/{len(p.snaps)}  {p.speed:g}x"
                                    f"{'  PAUSED' if p.paused else ''}{'  END' if p.done else ''}")

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        view = self.active_view
        if view == "history":
            self._load_sessions()
        if view == "servers" and not self._log_chain:
            self._log_chain = True
            self._poll_log()
        self.refresh_views()

    # ---- worker plumbing -----------------------------------------------------------------------------

    def on_problem(self, message: msg.Problem) -> None:
        self.notify(message.text, severity="error", timeout=10)
        self.state.events.append(Event(time.time(), "gpudash", message.what, "launcher", ok=False,
                                       reason=message.text))
        self.refresh_views()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one handler for failed workers: say what failed and log it as an event."""
        if event.state != WorkerState.ERROR:
            return
        name, err = event.worker.name, event.worker.error
        if name == "feed.start":
            self.header.source = f"{self.feed.source}: failed to start"
        if name == "servers.log_tail":
            self._log_chain = False
        self.notify(f"{name} failed: {err}", severity="error", timeout=8)
        self.state.events.append(Event(time.time(), "gpudash", "worker.error", name, ok=False, reason=str(err)))
        self.refresh_views()

    def _worker(self, fn: Any, name: str, group: str = "default") -> None:
        self.run_worker(fn, name=name, group=group, thread=True, exit_on_error=False)

    # ---- view switching and selection ----------------------------------------------------------------

    def action_show_view(self, view: str) -> None:
        self.query_one(TabbedContent).active = view

    def action_select(self, step: int) -> None:
        view = self.active_view
        if view == "history":
            if self.sessions:
                self.session_cursor = (self.session_cursor + step) % len(self.sessions)
                self.query_one(HistoryView).show_sessions(self.sessions, self.session_cursor)
        elif view in ("servers", "split"):
            self._cycle_server(step)
        elif view == "pools":
            shards = self.state.latest.pool_shards if self.state.latest else ()
            if shards:
                self.shard_cursor = (self.shard_cursor + step) % len(shards)
                self.refresh_views()
        else:
            self._cycle_gpu(step)

    def action_select_gpu(self) -> None:
        self._cycle_gpu(1)

    def action_select_server(self) -> None:
        self._cycle_server(1)

    def _cycle_gpu(self, step: int) -> None:
        n = len(self.state.latest.gpus) if self.state.latest else 0
        if n:
            self.selected_gpu = (self.selected_gpu + step) % n
            self.refresh_views()

    def _server_names(self) -> list[str]:
        snap = self.state.latest
        return [s.server for s in snap.servers] if snap and snap.servers else list(self.state.specs)

    def _cycle_server(self, step: int) -> None:
        names = self._server_names()
        if not names:
            self.notify("no servers to select")
            return
        i = names.index(self.selected_server) if self.selected_server in names else -step
        self.selected_server = names[(i + step) % len(names)]
        self.refresh_views()
        if self.active_view == "servers":
            self._poll_log(rechain=False)

    # ---- changes: forms -> pending command -> (confirm) -> Controller.apply in a worker --------------

    @property
    def controller(self) -> Any:
        return self.info.controller if self.info is not None else None

    def _selected_spec(self) -> Any:
        if self.selected_server is None or self.selected_server not in self.state.specs:
            self.notify("select a server first (s); none is known yet", severity="warning")
            return None
        return self.state.specs[self.selected_server]

    def action_edit_split(self) -> None:
        from gpudash.tui.screens.forms import SplitForm

        spec = self._selected_spec()
        if spec is not None:
            self.push_screen(SplitForm(spec), self._propose)

    def action_apply_plan(self) -> None:
        """Propose the split planner's -ts for the selected split server (or the only one), to confirm."""
        snap = self.state.latest
        servers = split_servers(self.state.specs.values(), len(snap.gpus)) if snap is not None else []
        if not servers:
            self.notify("no model is split across GPUs: nothing to plan", severity="warning")
            return
        spec = next((s for s in servers if s.name == self.selected_server), servers[0])
        plan = recommend_split(spec, snap, self.state.model_bytes.get(spec.name))
        if isinstance(plan, str):
            self.notify(f"{spec.name}: {plan}", severity="warning", timeout=8)
            return
        if runs_plan(spec, plan):
            self.notify(f"{spec.name} already runs the planned split -ts {plan.ts}")
            return
        self._propose(SetSplit(spec.name, ts_ratios(plan.ts)))

    def action_edit_share(self) -> None:
        """On the Pools view: the selected shard's size; elsewhere: the selected server's memory share."""
        from gpudash.tui.screens.forms import ShardForm, ShareForm

        if self.active_view == "pools":
            shards = self.state.latest.pool_shards if self.state.latest else ()
            if not shards:
                self.notify("no memory pools yet", severity="warning")
                return
            s = shards[min(self.shard_cursor, len(shards) - 1)]
            self.push_screen(ShardForm(s.pool, s.shard, s.capacity), self._propose)
            return
        spec = self._selected_spec()
        if spec is not None:
            self.push_screen(ShareForm(spec), self._propose)

    def action_edit_knobs(self) -> None:
        from gpudash.tui.screens.forms import KnobForm

        self.push_screen(KnobForm(dict(self.state.knobs)), self._propose)

    def action_server(self, action: str) -> None:
        if self.selected_server is None:
            self.notify("no server selected (s selects one)", severity="warning")
            return
        self._propose(ServerAction(self.selected_server, action))  # type: ignore[arg-type]

    def action_toggle_recording(self) -> None:
        self._propose(SetRecording(not self.header.recording))

    def _propose(self, command: Command | None) -> None:
        if command is None:
            return
        self.pending_command = command
        self.header.pending = describe(command)
        self.action_apply()

    def action_apply(self) -> None:
        from gpudash.tui.screens.dialogs import ConfirmScreen

        command = self.pending_command
        if command is None:
            self.notify("nothing to apply: edit split (t), share (m) or knobs (k) first")
            return
        if relaunches(command):
            self.push_screen(ConfirmScreen(f"{describe(command)}.\nThis re-launches the server: it stops serving "
                                           "until it is healthy again. Apply?"),
                             lambda yes: self._run_apply(command) if yes else None)
        else:
            self._run_apply(command)

    def _run_apply(self, command: Command) -> None:
        self.pending_command = None
        self.header.pending = ""
        self.notify(f"applying: {describe(command)}…")
        self._worker(partial(self._apply_blocking, command), f"control.apply.{type(command).__name__}", "control")

    def _apply_blocking(self, command: Command) -> None:
        controller = self.controller
        if controller is None:
            self.post_message(msg.Applied(False, "no live rig to change (replay, or still starting)",
                                          describe(command)))
            return
        res = controller.apply(command)
        self.post_message(msg.Applied(res.ok, res.reason, describe(command)))
        self.post_message(msg.SpecsChanged(controller.specs()))
        self.post_message(msg.KnobsChanged(controller.knobs()))

    def on_applied(self, message: msg.Applied) -> None:
        if message.ok:
            self.notify(f"applied: {message.summary}")
        else:
            self.notify(f"refused: {message.reason}", severity="error", timeout=8)
        if self.controller is not None and self.controller.recorder is not None:
            self.header.recording = self.controller.recorder.on

    # ---- servers: log tail as a chain ----------------------------------------------------------------

    def _poll_log(self, rechain: bool = True) -> None:
        if not self._alive() or self.active_view != "servers" or self.controller is None or self.controller.supervisor is None \
                or self.selected_server is None:
            self._log_chain = False
            return
        name, sup = self.selected_server, self.controller.supervisor
        self._worker(lambda: self.post_message(msg.LogTail(name, sup.log_tail(name, 200), rechain)),
                     "servers.log_tail", "logs")

    def on_log_tail(self, message: msg.LogTail) -> None:
        if message.server == self.selected_server:
            self.query_one(ServersView).show_log(message.server, message.lines)
        if message.rechain:
            self.set_timer(LOG_POLL_S, self._poll_log)

    # ---- history and export --------------------------------------------------------------------------

    def _db_path(self) -> str | None:
        return self.info.db_path if self.info is not None else None

    def _load_sessions(self) -> None:
        db = self._db_path()
        if db is None or not Path(db).exists():
            self.query_one(HistoryView).show_sessions([], 0)
            return

        def load() -> None:
            from gpudash.store import Store

            with Store.open(db) as store:
                self.post_message(msg.SessionsLoaded(store.sessions()))

        self._worker(load, "history.load", "store")

    def on_sessions_loaded(self, message: msg.SessionsLoaded) -> None:
        self.sessions = list(reversed(message.sessions))  # newest first
        self.session_cursor = min(self.session_cursor, max(0, len(self.sessions) - 1))
        self.query_one(HistoryView).show_sessions(self.sessions, self.session_cursor)

    def action_export(self) -> None:
        db = self._db_path()
        if self.active_view == "history" and self.sessions:
            sid = self.sessions[self.session_cursor].id
        elif self.controller is not None and self.controller.recorder is not None \
                and self.controller.recorder.session_id is not None:
            sid = self.controller.recorder.session_id
        else:
            self.notify("nothing to export: open History (7) and select a recorded session", severity="warning")
            return
        out = self.export_dir / f"gpudash-session-{sid}"

        def export() -> None:
            from gpudash.store import Store
            from gpudash.store.export import ExportError, export_session

            with Store.open(db) as store:
                try:
                    done = export_session(store, sid, "csv", out, force=True)
                    self.post_message(msg.Exported(True, f"exported session {sid}: {len(done)} tables to {out}"))
                except ExportError as err:
                    self.post_message(msg.Exported(False, str(err)))

        self._worker(export, "history.export", "store")

    def on_exported(self, message: msg.Exported) -> None:
        self.notify(message.text, severity="information" if message.ok else "error")

    # ---- bindings: availability, help, command palette -----------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        ids = ACTION_IDS.get(action, set())
        if ids & REPLAY_ONLY and not self.replay:
            return False
        if ids & LIVE_ONLY and self.replay:
            return False
        return True

    def key_of(self, b: Binding) -> str:
        """How the key of binding `b` reads on screen, after the config's [keys] remaps."""
        return self.get_key_display(replace(b, key=self.keys.get(b.id or "", b.key)))

    def binding_rows(self) -> list[tuple[str, str, str]]:
        """(key, id, description) for every binding available in this mode, with [keys] remaps applied."""
        return [(self.key_of(b), b.id or "", b.description)
                for b in self.BINDINGS if self.check_action(b.action.split("(")[0], ()) is not False]

    def action_help(self) -> None:
        from gpudash.tui.screens.dialogs import HelpScreen

        self.push_screen(HelpScreen(self.binding_rows()))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for b in self.BINDINGS:
            if self.check_action(b.action.split("(")[0], ()) is not False:
                yield SystemCommand(b.description, f"key {self.key_of(b)} ({b.id})",
                                    partial(self.run_action, b.action))

    # ---- quitting ------------------------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Stop what gpudash started (servers, sampler, recorder, engine) off the UI thread, then exit."""
        self.header.source = f"{self.header.source} (stopping…)"
        self._worker(self.close_feed, "feed.close", "close")

    def close_feed(self) -> None:
        """Close the feed once; a second caller (on_unmount while the quit worker is still closing) waits
        until the first has finished, so nothing outlives the app (the last events reach the store)."""
        with self._feed_close_lock:
            if self._feed_closed:
                return
            self.feed.close()
            self._feed_closed = True
        self.post_message(msg.FeedClosed())

    def on_feed_closed(self, message: msg.FeedClosed) -> None:
        self.exit()

    def on_unmount(self) -> None:
        self.close_feed()  # e.g. ctrl+c or a test leaving run_test: still stop everything
