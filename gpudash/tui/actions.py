"""Views and key actions as data: one table that the key bindings, the footer, the help screen and the
command palette all read, so a key is declared once and shows the same everywhere.

An action names the method it runs (``action_<method>``) and its arguments as values, never as a
string to parse. Its `target` says whose method that is (harlequin's widget-targeted actions): the app's
(None), or the view on screen's, where that view is a `target` (a DashView subclass): the key works and
shows only on those tabs. `mode` limits it to the live or the replay app.

A view is one row of VIEWS; gpudash/tui/widgets/view.py says how to add one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from textual.binding import Binding

from gpudash.tui.widgets.fleet import FleetView
from gpudash.tui.widgets.history import HistoryView
from gpudash.tui.widgets.latency import LatencyView
from gpudash.tui.widgets.overview import OverviewView
from gpudash.tui.widgets.processes import ProcessesView
from gpudash.tui.widgets.servers import ServerPicker, ServersView, SplitView
from gpudash.tui.widgets.tables import EngineView, EventsView, PoolsView
from gpudash.tui.widgets.view import DashView

Mode = Literal["any", "live", "replay"]


@dataclass(frozen=True, slots=True)
class View:
    """One tab: its id (also the TabPane id), its title and the widget that draws it."""

    id: str
    title: str
    widget: type[DashView]


VIEWS: tuple[View, ...] = (
    View("overview", "Overview", OverviewView),
    View("split", "Split", SplitView),
    View("servers", "Servers", ServersView),
    View("latency", "Latency", LatencyView),
    View("engine", "Engine", EngineView),
    View("pools", "Pools", PoolsView),
    View("history", "History", HistoryView),
    View("events", "Events", EventsView),
    View("processes", "Processes", ProcessesView),
    View("fleet", "Fleet", FleetView),
)


@dataclass(frozen=True, slots=True)
class Action:
    """One key action. `id` is the binding id and the name to remap in the config's [keys]."""

    id: str
    key: str
    method: str  # the target runs action_<method>(*args)
    description: str
    args: tuple[object, ...] = ()
    show: bool = True  # listed in the footer (where it applies); every action is in help and palette
    priority: bool = False  # checked before the focused widget's own keys
    mode: Mode = "any"
    target: type[DashView] | None = None  # None: the app's action; else the view on screen's, where it is one

    @property
    def views(self) -> tuple[str, ...]:
        """The tabs it applies to; empty: every tab."""
        if self.target is None or self.target is DashView:
            return ()
        return tuple(v.id for v in VIEWS if issubclass(v.widget, self.target))

    @property
    def parsed(self) -> tuple[str, tuple[object, ...]]:
        """The app action and its arguments, as Textual hands them to check_action: a view's action goes
        through the app's `view` action, which runs it on the view on screen."""
        return (self.method, self.args) if self.target is None else ("view", (self.method, *self.args))

    @property
    def call(self) -> str:
        """The action string Textual binds: method(arg, ...) with the args written as literals."""
        name, args = self.parsed
        return f"{name}({', '.join(repr(a) for a in args)})" if args else name

    def available(self, replay: bool, view: str) -> bool:
        """Whether the key works in this app mode on this tab."""
        if self.mode == ("live" if replay else "replay"):
            return False
        return not self.views or view in self.views

    def binding(self) -> Binding:
        return Binding(self.key, self.call, self.description, show=False, priority=self.priority, id=self.id)


ACTIONS: tuple[Action, ...] = (
    *(Action(f"view_{v.id}", str((i + 1) % 10), "show_view", v.title, (v.id,), show=False)  # the tenth: 0
      for i, v in enumerate(VIEWS)),
    Action("select_next", "down", "select", "Select next", (1,), show=False, target=DashView),
    Action("select_previous", "up", "select", "Select previous", (-1,), show=False, target=DashView),
    Action("select_gpu", "g", "select_gpu", "Next GPU", target=OverviewView),
    Action("select_server", "s", "select_server", "Next server", target=ServerPicker),
    Action("server_start", "S", "server", "Start", ("start",), mode="live", target=ServersView),
    Action("server_stop", "x", "server", "Stop", ("stop",), mode="live", target=ServersView),
    Action("server_restart", "R", "server", "Restart", ("restart",), mode="live", target=ServersView),
    Action("server_sleep", "z", "server", "Sleep (vLLM)", ("sleep",), mode="live", target=ServersView),
    Action("server_wake", "w", "server", "Wake (vLLM)", ("wake",), mode="live", target=ServersView),
    Action("attach_found", "A", "attach_found", "Attach found", mode="live", target=ServersView),
    Action("write_found", "W", "write_found", "Write found to config", mode="live", target=ServersView),
    Action("edit_split", "t", "edit_split", "Split ratios", mode="live", target=ServerPicker),
    Action("apply_plan", "p", "apply_plan", "Planned split", mode="live", target=ServerPicker),
    Action("edit_share", "m", "edit_share", "Memory share", mode="live", target=ServerPicker),
    Action("edit_shard", "m", "edit_shard", "Shard size", mode="live", target=PoolsView),
    Action("edit_knobs", "k", "edit_knobs", "Engine knobs", mode="live"),
    Action("save_knobs", "w", "save_knobs", "Save knobs to config", mode="live", target=EngineView),
    Action("apply", "a", "apply", "Apply pending", mode="live", show=False),
    Action("discard", "escape", "discard", "Discard pending", mode="live", show=False),
    Action("toggle_recording", "r", "toggle_recording", "Recording", mode="live"),
    Action("stop_demo", "D", "stop_demo", "Stop the demo", mode="live"),  # offered while the demo runs
    Action("export", "e", "export", "Export session", target=HistoryView),
    Action("sort_processes", "o", "sort_processes", "Sort: next column", (1,), target=ProcessesView),
    Action("sort_processes_back", "O", "sort_processes", "Sort: previous column", (-1,), show=False,
           target=ProcessesView),
    Action("reverse_processes", "I", "reverse_processes", "Reverse order", target=ProcessesView),
    Action("signal_process", "K", "signal_process", "Stop/signal", mode="live", target=ProcessesView),
    Action("filter_processes", "slash", "filter_processes", "Filter", target=ProcessesView),
    Action("sort_fleet", "o", "sort_fleet", "Sort order", target=FleetView),
    Action("filter_fleet", "slash", "filter_fleet", "Filter", target=FleetView),
    Action("open_box", "enter", "open_box", "Open box", target=FleetView),
    Action("replay_pause", "space", "replay_pause", "Pause/play", mode="replay"),
    Action("replay_step", "full_stop", "replay_step", "Step one tick", mode="replay"),
    Action("replay_back", "left_square_bracket", "replay_seek", "Seek back", (-1,), mode="replay"),
    Action("replay_forward", "right_square_bracket", "replay_seek", "Seek forward", (1,), mode="replay"),
    Action("replay_slower", "minus", "replay_speed", "Slower", (False,), mode="replay"),
    Action("replay_faster", "plus,equals_sign", "replay_speed", "Faster", (True,), mode="replay"),
    Action("help", "question_mark", "help", "Help", show=False),
    Action("quit", "q", "quit", "Quit", show=False),
    Action("help_f1", "f1,h", "help", "Help (htop's and nvitop's keys)", show=False),
    Action("quit_f10", "f10", "quit", "Quit (htop's key)", show=False),
)
"""`help` and `quit` are not in the per-tab list: the footer pins them to its right end."""

BY_ID: dict[str, Action] = {a.id: a for a in ACTIONS}
# What Textual hands check_action: the method name and the parsed arguments.
BY_CALL: dict[tuple[str, tuple[object, ...]], list[Action]] = {}
for _a in ACTIONS:
    BY_CALL.setdefault(_a.parsed, []).append(_a)

PINNED = (BY_ID["help"], BY_ID["quit"])


def bindings() -> list[Binding]:
    return [a.binding() for a in ACTIONS]
