"""The gpudash Textual app: views over snapshots from an injected feed (live rig or recorded session),
and keyboard-driven changes that all go through `gpudash.runtime.control.Controller.apply`.

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

import platformdirs
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from gpudash.config import APP_NAME
from gpudash.runtime.control import ServerAction, SetRecording, describe
from gpudash.records import GPU_FAULT_KINDS, LLAMA_BUILD_KIND, Event, Snapshot
from gpudash.tui import messages as msg
from gpudash.tui.actions import ACTIONS, BY_CALL, BY_ID, PINNED, VIEWS, Action, bindings
from gpudash.tui.changes import ChangeFlow
from gpudash.runtime.feed import Feed, FeedInfo
from gpudash.runtime.replay import Player
from gpudash.tui.state import ViewState
from gpudash.tui.widgets.build_bar import BuildBar
from gpudash.tui.widgets.header import SourceHeader
from gpudash.tui.widgets.keybar import KeyBar
from gpudash.tui.widgets.notices import NoticeLine
from gpudash.tui.widgets.view import DashView

TABS_WIDTH = sum(len(v.title) + 2 for v in VIEWS)  # the tab bar with Textual's padding (85 cells for 10 tabs)
MAX_PENDING = 256  # snapshots waiting for the UI; older ones are folded into newer ones beyond this
SEEK_TICKS = 10  # how far one replay seek key moves
ENGINE_VIEWS = ("engine", "pools")  # views of the transfer engine: showing one starts it where it waits


def default_export_dir() -> Path:
    """Where History's export proposes its folder: the user's data folder, never the current directory
    (often a git checkout, where an export is one `git add .` away from being committed)."""
    return Path(platformdirs.user_data_dir(APP_NAME)) / "exports"


class GpudashApp(App[None]):
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
        self._header: SourceHeader | None = None  # held once mounted, like the views
        self._build_bar: BuildBar | None = None
        self._notices: NoticeLine | None = None
        self._demo_ran = False  # whether the demo ran at the last redraw (its key in the footer)
        self._build_failed: str | None = None  # why the last llama-server build failed, until one succeeds
        self._view_widgets: dict[str, DashView] = {}  # by tab id, held (a DOM query walks the whole tree)
        self._shown: DashView | None = None  # the view on screen when the tab last changed
        self.keys = dict(keys or {})
        self.state = ViewState(config_path=config_path, export_dir=export_dir or default_export_dir())
        self.info: FeedInfo | None = None
        self.player: Player | None = None
        self._speed = speed
        self._pending: deque[Snapshot] = deque()
        self._pending_lock = threading.Lock()
        self.changes = ChangeFlow(self)  # the one pending change and its dialogs
        self.first_frame_at: float | None = None
        self._feed_closed = False
        self._feed_close_lock = threading.Lock()

    # ---- layout --------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield SourceHeader(id="header")
        yield BuildBar(id="build-bar")
        with TabbedContent(id="views", initial=VIEWS[0].id):
            for view in VIEWS:
                with TabPane(view.title, id=view.id):
                    yield view.widget(id=f"{view.id}-view")
        with Vertical(id="bottom"):  # docked: the notices' line (when there is one) above the keys
            yield NoticeLine(id="notices")
            yield KeyBar(id="keybar")

    def on_resize(self, event: events.Resize) -> None:
        self._fit_tabs(event.size.width)

    def _fit_tabs(self, width: int) -> None:
        """Below TABS_WIDTH columns (80 included) the tabs lose their right padding, so every title shows
        whole instead of the bar scrolling "Fleet" or "Overview" off its edge."""
        if self._views is not None:
            self._views.set_class(width < TABS_WIDTH, "narrow-tabs")

    def on_mount(self) -> None:
        self._views = self.query_one("#views", TabbedContent)
        self._fit_tabs(self.size.width)
        self._header = self.query_one(SourceHeader)
        self._build_bar = self.query_one(BuildBar)
        self._notices = self.query_one(NoticeLine)
        self._view_widgets = {v.id: self.query_one(f"#{v.id}-view", DashView) for v in VIEWS}
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
        self.in_thread(self._start_feed, "feed.start", "feed")

    @property
    def header(self) -> SourceHeader:
        """The header, held: at shutdown Textual can remove it while the tabs are still attached."""
        assert self._header is not None, "the header is held from on_mount on"
        return self._header

    @property
    def active_view(self) -> str:
        return (self._views.active if self._alive() else "") or VIEWS[0].id

    @property
    def view(self) -> DashView:
        """The view on screen."""
        return self._view_widgets[self.active_view]

    def _alive(self) -> bool:
        """False before the views are mounted and once the app is shutting down: timers and queued
        messages (a snapshot, the log-tail chain) can still fire then, and must not query the DOM. The
        views are held, not queried: a query walks the whole DOM (0.4 ms, twice a tick). The header is
        checked too: teardown removed it first once, under a snapshot that was still queued."""
        return (self._views is not None and self._views.is_attached and self._header is not None
                and self._header.is_attached)

    def notify(self, message: str, *, title: str = "", severity: Any = "information", timeout: float | None = None,
               markup: bool = False) -> None:
        """A notice on the line above the keys (Textual's toasts, drawn over forms and text, are hidden by
        app.tcss; they are still recorded), always as plain text: notices carry user text (paths, server
        names, "[engine]"), which Rich markup would eat. Widgets and screens pass Textual's markup=True
        through here; it is ignored."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)
        if self._notices is not None and self._notices.is_attached:
            self._notices.add(f"{title}: {message}" if title else message, severity,
                              self.NOTIFICATION_TIMEOUT if timeout is None else timeout)

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
        self.state.begin(info, live=not self.replay)
        self.state.update_warnings()
        self._read_model_sizes()
        self._read_builds()
        if not self._alive():
            return
        h = self.header
        h.source, h.rig, h.db_path, h.recording = info.source, info.rig, info.db_path or "—", info.recording
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
        if any(e.kind in ("server.start", "server.restart") for s in snaps for e in s.events):
            self._read_builds()  # a server started: on a CUDA build gpudash compiled, maybe
        for fault in (e for s in snaps for e in s.events if e.kind in GPU_FAULT_KINDS):
            self.notify(f"{fault.target}: {fault.reason}", title="GPU fault", severity="error", timeout=30)
        self._follow_builds([e for s in snaps for e in s.events if e.kind == LLAMA_BUILD_KIND])
        self.refresh_views()

    def _follow_builds(self, steps: list[Event]) -> None:
        """A llama-server build's failure is a notice and stays in the header until a later step succeeds
        (its servers then start on a llama-server that appeared)."""
        for e in steps:
            if e.ok:
                self._build_failed = None
            else:
                self._build_failed = e.reason or str(e.new)
                self.notify(f"llama-server build failed: {self._build_failed}", severity="error", timeout=30)

    def on_specs_changed(self, message: msg.SpecsChanged) -> None:
        self.state.specs = dict(message.specs)
        self.state.update_warnings()
        self._read_model_sizes()
        self._read_builds()
        self.refresh_views()

    def _read_builds(self) -> None:
        """Which servers run a llama.cpp build without GPU offload, read from the binaries in a worker: a
        split or share is refused before it relaunches anything, not after its log says so."""
        if not self.replay:
            self.in_thread(lambda: self.post_message(msg.CpuBuilds(self.feed.cpu_builds())), "servers.builds",
                           "builds")

    def on_cpu_builds(self, message: msg.CpuBuilds) -> None:
        self.state.cpu_builds = dict(message.builds)
        self.refresh_keys()  # the split and share keys follow it
        self.refresh_views()

    def _read_model_sizes(self) -> None:
        """The split planner sizes a model by its file: stat the files in a worker (a slow disk or a
        network mount never stalls the UI)."""
        specs = list(self.state.specs.values())

        def read() -> None:
            sizes = {}
            for spec in specs:
                p = Path(spec.model).expanduser() if spec.model else None  # an attached server names no file
                if p is not None and p.is_file():
                    sizes[spec.name] = p.stat().st_size
            self.post_message(msg.ModelSizes(sizes))

        self.in_thread(read, "split.model_sizes", "models")

    def on_model_sizes(self, message: msg.ModelSizes) -> None:
        self.state.model_bytes = dict(message.sizes)
        self.refresh_views()

    def on_process_info(self, message: msg.ProcessInfo) -> None:
        asked = self.state.proc_asked  # a pid gone while it was looked up is not kept
        self.state.proc_info.update({pid: info for pid, info in message.info.items() if pid in asked})
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
        if self._build_bar is not None:
            self._build_bar.show_builds(self.state.latest.builds if self.state.latest is not None else ())
        self.header.demo, self.header.demo_key = self._demo_badge()
        self.view.show(self.state)
        demo_runs = self.state.demo_running()  # the demo's stop key shows while it runs
        if self.view.KEYS_FOLLOW_STATE or demo_runs != self._demo_ran:
            self._demo_ran = demo_runs
            self.refresh_keys()
        if self.player is not None:
            p = self.player
            self.header.position = (f"tick {p.index + 1}/{len(p.snaps)}  {p.speed:g}x"
                                    f"{'  PAUSED' if p.paused else ''}{'  END' if p.done else ''}")
            self.refresh_keys()  # the pause key reads Play while paused

    def _demo_badge(self) -> tuple[str, str]:
        """The header's word on the embedded demo: what its llama-server costs while it runs (the probe's
        share is in gpudash's own CPU, on the host line), and the key that stops it."""
        state = self.state
        if state.demo is None or self.replay:
            return "", ""
        if not state.demo_running():
            return self._demo_waits(), ""
        cpu = state.demo_cpu()
        return f"DEMO{'' if cpu is None else f' {cpu:.0f}% CPU'}", self.key_of(BY_ID["stop_demo"])

    def _demo_waits(self) -> str:
        """What a demo that does not run waits for: a llama-server build (with its progress), a llama-server
        after a failed build, or nothing (stopped)."""
        builds = self.state.latest.builds if self.state.latest is not None else ()
        if builds:
            b = builds[0]
            done = f" {100 * (b.done or 0) // b.total}%" if b.total else ""
            return f"DEMO waits for {'another ' if b.step == 'waiting' else ''}build{done}"
        if self._build_failed is not None:
            return "DEMO: build failed"
        return "DEMO stopped"

    def action_stop_demo(self) -> None:
        """`D`: stop the embedded demo at once (the header said what it costs; S on Servers starts it again)."""
        if self.state.demo is None or not self.state.demo_running():
            self.notify("no demo runs: nothing to stop")
            return
        self.changes.propose(ServerAction(self.state.demo, "stop"), confirmed=True)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if self.active_view in ENGINE_VIEWS and self.info is not None and not self.replay:
            # on real GPUs the engine (a CUDA context) starts when a view of it is first shown
            self.in_thread(self._want_engine, "engine.start", "engine")
        self.refresh_keys()
        self.refresh_views()
        previous, self._shown = self._shown, self.view
        self.view.shown(previous)

    def _want_engine(self) -> None:
        for text in self.feed.want_engine():
            self.post_message(msg.Problem("engine.start", text))

    # ---- worker plumbing -----------------------------------------------------------------------------

    def on_problem(self, message: msg.Problem) -> None:
        self.notify(message.text, severity="error", timeout=10)
        self.state.events.append(Event(time.time(), "gpudash", message.what, "launcher", ok=False,
                                       reason=message.text))
        self.refresh_views()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The app's own failed workers (a view reports its own as WorkerFailed)."""
        if event.state == WorkerState.ERROR:
            self.on_worker_failed(msg.WorkerFailed(event.worker.name, event.worker.error))

    def on_worker_failed(self, message: msg.WorkerFailed) -> None:
        """The one handler for failed workers: say what failed and log it as an event."""
        name, err = message.name, message.error
        if name == "feed.start":
            self.header.source = f"{self.feed.source}: failed to start"
        self.notify(f"{name} failed: {err}", severity="error", timeout=8)
        self.state.events.append(Event(time.time(), "gpudash", "worker.error", name, ok=False, reason=str(err)))
        self.refresh_views()

    def in_thread(self, fn: Any, name: str, group: str = "default") -> None:
        """Blocking work on a named thread worker; it posts its result as a message."""
        self.run_worker(fn, name=name, group=group, thread=True, exit_on_error=False)

    # ---- views: switching, and the actions a view owns -----------------------------------------------

    def action_show_view(self, view: str) -> None:
        self.query_one(TabbedContent).active = view

    def action_view(self, method: str, *args: object) -> None:
        """A view's own action (an Action with a target): check_action let it through only where the view
        on screen is one of the target's."""
        getattr(self.view, f"action_{method}")(*args)

    # ---- changes: views and forms propose -> (confirm) -> Controller.apply in a worker -----------------

    @property
    def controller(self) -> Any:
        return self.info.controller if self.info is not None else None

    def on_propose(self, message: msg.Propose) -> None:
        self.changes.propose(message.command, message.confirmed)

    def action_apply(self) -> None:
        self.changes.apply_pending()

    def action_discard(self) -> None:
        self.changes.discard_pending()

    def action_edit_knobs(self) -> None:
        from gpudash.tui.screens.forms import KnobForm

        self.push_screen(KnobForm(dict(self.state.knobs)), self.changes.propose)

    def action_toggle_recording(self) -> None:
        self.changes.propose(SetRecording(not self.header.recording))

    def on_applied(self, message: msg.Applied) -> None:
        if message.ok:
            self.notify(f"applied: {message.summary}")
        else:
            self.notify(f"refused: {message.reason}", severity="error", timeout=8)
        if self.controller is not None and self.controller.recorder is not None:
            self.header.recording = self.controller.recorder.on

    # ---- replay: the playback chain (show a tick, schedule the next) and its keys ---------------------

    def _replay_tick(self) -> None:
        p = self.player
        if p is None or p.paused:
            return
        snap = p.step()
        if snap is not None:
            self.state.ingest(snap)
        self.refresh_views()
        if not p.done:
            self.set_timer(p.delay_to_next(), self._replay_tick)

    def action_replay_pause(self) -> None:
        if self.player is None:
            return
        self.player.paused = not self.player.paused
        if not self.player.paused:
            self._replay_tick()
        self.refresh_views()

    def action_replay_step(self) -> None:
        if self.player is None:
            return
        self.player.paused = True
        snap = self.player.step()
        if snap is not None:
            self.state.ingest(snap)
        self.refresh_views()

    def action_replay_seek(self, direction: int) -> None:
        if self.player is not None and self.player.snaps:
            self.seek_to(self.player.index + direction * SEEK_TICKS)

    def seek_to(self, index: int) -> None:
        """Show tick `index` as it was: plots from the ticks before it, events up to that moment."""
        p = self.player
        if p is None or not p.snaps:
            return
        i = p.seek(index)
        self.state = self.state.rewound()  # the recorded settings, moved on by the events up to tick i
        self.state.ingest_all(p.snaps[: i + 1])
        self.refresh_views()

    def action_replay_speed(self, up: bool) -> None:
        if self.player is not None:
            self.player.faster(up)
            self.refresh_views()

    # ---- keys: availability, footer, help, command palette (all from the actions table) --------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        found = BY_CALL.get((action, parameters))
        if found is None:  # not one of ours (e.g. Textual's own actions)
            return True
        return any(a.available(self.replay, self.active_view) for a in found)

    def key_of(self, a: Action) -> str:
        """How the key of action `a` reads on screen, after the config's [keys] remaps ("+ or =" for a
        binding of several keys, never Textual's key names)."""
        keys = self.keys.get(a.id, a.key).split(",")
        return " or ".join(self.get_key_display(Binding(k.strip(), a.call)) for k in keys)

    def binding_rows(self) -> list[tuple[str, str, str, str]]:
        """(key, id, description, where) for every action of this mode, with [keys] remaps applied."""
        mode_ok = [a for a in ACTIONS if a.mode != ("live" if self.replay else "replay")]
        return [(self.key_of(a), a.id, a.description, ", ".join(a.views) or "all tabs") for a in mode_ok]

    def refresh_keys(self) -> None:
        """The footer: this tab's keys, the pending change if any, Help and Quit pinned right."""
        if not self._alive():
            return
        view = self.active_view
        pending = self.changes.pending
        if pending is None:
            items = [(self.key_of(a), self._label(a)) for a in ACTIONS if a.show and a.available(self.replay, view)
                     and (self.view.offers(a.method) if a.target is not None else self._offers(a))]
            note = None
        else:  # the bar is about the pending change until it is applied or discarded
            items = [(self.key_of(BY_ID["apply"]), "apply"), (self.key_of(BY_ID["discard"]), "discard")]
            note = Text.assemble(("│ pending: ", "bold magenta"), (describe(pending), "magenta"))
        self.query_one(KeyBar).show_keys(items, [(self.key_of(a), a.description) for a in PINNED], note,
                                         self.key_of(BY_ID["help"]))

    def _offers(self, a: Action) -> bool:
        """Whether the footer offers an app action now: the demo's stop only while the demo runs."""
        return a.id != "stop_demo" or self.state.demo_running()

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
        self.changes.confirm_quit(self._quit_now)

    def _quit_now(self) -> None:
        self.header.source = f"{self.header.source} (stopping…)"
        self.in_thread(self.close_feed, "feed.close", "close")

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
