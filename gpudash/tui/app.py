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

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from gpudash.control import Command, ServerAction, SetRecording, SetShare, SetSplit, describe
from gpudash.records import GPU_FAULT_KINDS, Event, Snapshot
from gpudash.tui import messages as msg
from gpudash.tui.actions import ACTIONS, BY_CALL, BY_ID, PINNED, VIEWS, Action, bindings
from gpudash.tui.changes import ChangeFlow
from gpudash.tui.history import HistoryControls
from gpudash.tui.feeds import Feed, FeedInfo, Player
from gpudash.tui.replay_controls import ReplayControls
from gpudash.tui.state import ViewState, recommend_split, runs_plan, split_servers, ts_ratios
from gpudash.tui.widgets.header import SourceHeader
from gpudash.tui.widgets.keybar import KeyBar
from gpudash.tui.widgets.latency import LatencyView
from gpudash.tui.widgets.overview import OverviewView
from gpudash.tui.widgets.processes import SORTS, ProcessesView
from gpudash.tui.widgets.tables import (EngineView, EventsView, HistoryView, PoolsView, ServersView,
                                        SplitView)

MAX_PENDING = 256  # snapshots waiting for the UI; older ones are folded into newer ones beyond this
LOG_POLL_S = 1.0


class GpudashApp(ChangeFlow, HistoryControls, ReplayControls, App[None]):
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "gpudash"
    ENABLE_COMMAND_PALETTE = True
    AUTO_FOCUS = None  # a focused widget inside a tab would switch the view when a modal closes
    BINDINGS = bindings()

    def __init__(self, feed: Feed, *, replay: bool = False, speed: float = 1.0, keys: dict[str, str] | None = None,
                 export_dir: Path | None = None, config_path: Path | None = None) -> None:
        super().__init__()
        self.animation_level = "none"  # a view switch shows at once; no 60 fps tab-underline animation
        self.feed = feed
        self.replay = replay
        self._views: TabbedContent | None = None  # the tabs of the views, once mounted
        self.keys = dict(keys or {})
        self.export_dir = export_dir or Path.cwd()
        self.config_path = config_path  # where `w` saves knob changes (None: the app was given no file)
        self.saved_knobs: dict[str, Any] = {}  # the knobs as the config file has them
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
        self.process_sort = 0  # index into processes.SORTS
        self.process_filter = ""
        self.first_frame_at: float | None = None
        self._log_chain = False
        self._history_chain = False
        self._feed_closed = False
        self._feed_close_lock = threading.Lock()

    # ---- layout --------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield SourceHeader(id="header")
        with TabbedContent(id="views", initial="overview"):
            for view in VIEWS:
                with TabPane(view.title, id=view.id):
                    yield view.widget(id=f"{view.id}-view")
        yield KeyBar(id="keybar")

    def on_mount(self) -> None:
        self._views = self.query_one("#views", TabbedContent)
        if self.keys:
            self.set_keymap(self.keys)
        self.header.source = "replay: loading…" if self.replay else f"{self.feed.source} (starting…)"
        self.header.rig = "" if self.replay else self.feed.source
        for tabs in self.query("Tabs"):
            tabs.can_focus = False
        self.refresh_keys()
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
        return (self._views.active if self._alive() else "") or "overview"

    def _alive(self) -> bool:
        """False before the views are mounted and once the app is shutting down: timers and queued
        messages (a snapshot, the log-tail chain) can still fire then, and must not query the DOM. The
        views are held, not queried: a query walks the whole DOM (0.4 ms, twice a tick)."""
        return self._views is not None and self._views.is_attached

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
        self.saved_knobs = dict(info.knobs)
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
        self.refresh_keys()
        self.refresh_views()

    def on_snapshots_pending(self, message: msg.SnapshotsPending) -> None:
        with self._pending_lock:
            snaps = list(self._pending)
            self._pending.clear()
        if not snaps:
            return
        self.state.ingest_all(snaps)
        for fault in (e for s in snaps for e in s.events if e.kind in GPU_FAULT_KINDS):
            self.notify(f"{fault.target}: {fault.reason}", title="GPU fault", severity="error", timeout=30)
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
            self.query_one(EngineView).update_view(self.state, self.unsaved_knobs(), self.config_path)
        elif view == "pools":
            self.query_one(PoolsView).update_view(self.state, self.shard_cursor)
        elif view == "events":
            self.query_one(EventsView).update_view(self.state)
        elif view == "processes":
            self.query_one(ProcessesView).update_view(self.state.latest, self.process_sort, self.process_filter)
        if self.player is not None:
            p = self.player
            self.header.position = (f"tick {p.index + 1}/{len(p.snaps)}  {p.speed:g}x"
                                    f"{'  PAUSED' if p.paused else ''}{'  END' if p.done else ''}")
            self.refresh_keys()  # the pause key reads Play while paused

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        view = self.active_view
        self.refresh_keys()
        if view == "history" and not self._history_chain:
            self._history_chain = True
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
        if name == "history.load":
            self._history_chain = False
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

    def action_sort_processes(self) -> None:
        self.process_sort = (self.process_sort + 1) % len(SORTS)
        self.refresh_views()

    def action_filter_processes(self) -> None:
        from gpudash.tui.screens.filter import FilterForm

        def done(text: str | None) -> None:
            if text is not None:
                self.process_filter = text.strip()
                self.refresh_views()

        self.push_screen(FilterForm("processes whose pid, name or server", self.process_filter), done)

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
        if spec is None:
            return
        gpus = self.server_gpus(spec)
        if gpus is None:
            self.notify("waiting for the first sample: the rig's GPUs are not known yet", severity="warning")
            return
        self.push_screen(SplitForm(spec, gpus), self._propose)

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

    def action_edit_shard(self) -> None:
        """The selected pool shard's size (Pools view)."""
        from gpudash.tui.screens.forms import ShardForm

        shards = self.state.latest.pool_shards if self.state.latest else ()
        if not shards:
            self.notify("no memory pools yet", severity="warning")
            return
        s = shards[min(self.shard_cursor, len(shards) - 1)]
        slab = next((p for p in self.state.latest.pools if p.pool == s.pool), None)
        self.push_screen(ShardForm(s.pool, s.shard, s.capacity, slab.unassigned if slab else None), self._propose)

    def action_edit_share(self) -> None:
        """The selected server's memory share of each of its GPUs."""
        from gpudash.tui.screens.forms import ShareForm

        spec = self._selected_spec()
        if spec is not None:
            self.push_screen(ShareForm(spec), self._propose)

    def unsaved_knobs(self) -> dict[str, Any]:
        """Knobs changed in this run that the config file does not have yet (none in a replay: its knob
        changes are the recording's, and there is no live config to save them into)."""
        if self.replay:
            return {}
        return {k: v for k, v in self.state.knobs.items() if k in self.saved_knobs and v != self.saved_knobs[k]}

    def action_save_knobs(self) -> None:
        """`w`: write the changed knobs into the config's [engine] section, so the next start has them."""
        changed = self.unsaved_knobs()
        if not changed:
            self.notify("the engine knobs match the config file: nothing to save")
            return
        if self.config_path is None:
            self.notify("no config file to save into (this run was started without one)", severity="warning")
            return
        path = self.config_path

        def save() -> None:
            from gpudash.config import ConfigError, save_engine_knobs

            try:
                save_engine_knobs(path, changed)
            except (ConfigError, OSError, ValueError) as err:
                self.post_message(msg.KnobsSaved(False, f"cannot save the knobs into {path}: {err}", changed))
                return
            self.post_message(msg.KnobsSaved(True, f"saved {', '.join(changed)} into [engine] of {path}", changed))

        self._worker(save, "config.save_knobs", "config")

    def on_knobs_saved(self, message: msg.KnobsSaved) -> None:
        if message.ok:
            self.saved_knobs.update(message.knobs)
        self.notify(message.text, severity="information" if message.ok else "error", timeout=8)
        self.refresh_views()

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

    def _gpus_of(self, command: Command) -> list[int] | None:
        """The GPUs a server change concerns, for the dialog's title."""
        if isinstance(command, (SetSplit, SetShare)) and command.server in self.state.specs:
            return self.server_gpus(self.state.specs[command.server])
        return None

    def server_gpus(self, spec: Any) -> list[int] | None:
        """The GPUs a server runs on: its `gpus`, else every GPU of the rig (None before the first tick)."""
        if spec.gpus:
            return list(spec.gpus)
        return list(range(len(self.state.latest.gpus))) if self.state.latest is not None else None

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

    # ---- keys: availability, footer, help, command palette (all from the actions table) --------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        found = BY_CALL.get((action, parameters))
        if found is None:  # not one of ours (e.g. Textual's own actions)
            return True
        return any(a.available(self.replay, self.active_view) for a in found)

    def key_of(self, a: Action) -> str:
        """How the key of action `a` reads on screen, after the config's [keys] remaps."""
        return self.get_key_display(Binding(self.keys.get(a.id, a.key), a.call))

    def binding_rows(self) -> list[tuple[str, str, str, str]]:
        """(key, id, description, where) for every action of this mode, with [keys] remaps applied."""
        mode_ok = [a for a in ACTIONS if a.mode != ("live" if self.replay else "replay")]
        return [(self.key_of(a), a.id, a.description, ", ".join(a.views) or "all tabs") for a in mode_ok]

    def refresh_keys(self) -> None:
        """The footer: this tab's keys, the pending change if any, Help and Quit pinned right."""
        if not self._alive():
            return
        view = self.active_view
        pending = self.pending_command
        if pending is None:
            items = [(self.key_of(a), self._label(a)) for a in ACTIONS if a.show and a.available(self.replay, view)]
            note = None
        else:  # the bar is about the pending change until it is applied or discarded
            items = [(self.key_of(BY_ID["apply"]), "apply"), (self.key_of(BY_ID["discard"]), "discard")]
            note = Text.assemble(("│ pending: ", "bold magenta"), (describe(pending), "magenta"))
        self.query_one(KeyBar).show_keys(items, [(self.key_of(a), a.description) for a in PINNED], note)

    def _label(self, a: Action) -> str:
        """An action's footer words, where they follow the state: replay's pause key, with the speed."""
        p = self.player
        if a.id == "replay_pause" and p is not None:
            return f"{'Play' if p.paused else 'Pause'} ({'paused' if p.paused else 'playing'} at {p.speed:g}x)"
        return a.description

    def action_help(self) -> None:
        from gpudash.tui.screens.dialogs import HelpScreen

        self.push_screen(HelpScreen(self.binding_rows()))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for a in ACTIONS:
            if a.mode != ("live" if self.replay else "replay"):
                where = f" on {', '.join(a.views)}" if a.views else ""
                yield SystemCommand(a.description, f"key {self.key_of(a)}{where} ({a.id})",
                                    partial(self._run_from_palette, a))

    def _run_from_palette(self, a: Action) -> None:
        """A tab's action chosen elsewhere goes to its tab first, where the operator sees what it acts on."""
        if a.views and self.active_view not in a.views:
            self.action_show_view(a.views[0])
        self.call_after_refresh(self.run_action, a.call)

    # ---- quitting ------------------------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Stop what gpudash started (servers, sampler, recorder, engine) off the UI thread, then exit;
        with a change pending, ask first."""
        self.confirm_quit(self._quit_now)

    def _quit_now(self) -> None:
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
