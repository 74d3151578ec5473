"""Views and key actions as data: one table that the key bindings, the footer, the help screen and the
command palette all read, so a key is declared once and shows the same everywhere.

An action names the app method it runs (``action_<method>``) and its arguments as values, never as a
string to parse; `views` limits it to some tabs (its key works and shows only there) and `mode` to the
live or the replay app.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from textual.binding import Binding
from textual.widget import Widget

from gpudash.tui.widgets.latency import LatencyView
from gpudash.tui.widgets.overview import OverviewView
from gpudash.tui.widgets.processes import ProcessesView
from gpudash.tui.widgets.tables import EngineView, EventsView, HistoryView, PoolsView, ServersView, SplitView

Mode = Literal["any", "live", "replay"]


@dataclass(frozen=True, slots=True)
class View:
    """One tab: its id (also the TabPane id), its title and the widget that draws it."""

    id: str
    title: str
    widget: type[Widget]


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
)


@dataclass(frozen=True, slots=True)
class Action:
    """One key action. `id` is the binding id and the name to remap in the config's [keys]."""

    id: str
    key: str
    method: str  # the app runs action_<method>(*args)
    description: str
    args: tuple[object, ...] = ()
    show: bool = True  # listed in the footer (where it applies); every action is in help and palette
    priority: bool = False  # checked before the focused widget's own keys
    mode: Mode = "any"
    views: tuple[str, ...] = ()  # tabs it applies to; empty: every tab

    @property
    def call(self) -> str:
        """The action string Textual binds: method(arg, ...) with the args written as literals."""
        return f"{self.method}({', '.join(repr(a) for a in self.args)})" if self.args else self.method

    def available(self, replay: bool, view: str) -> bool:
        """Whether the key works in this app mode on this tab."""
        if self.mode == ("live" if replay else "replay"):
            return False
        return not self.views or view in self.views

    def binding(self) -> Binding:
        return Binding(self.key, self.call, self.description, show=False, priority=self.priority, id=self.id)


_SERVER_VIEWS = ("servers", "split")

ACTIONS: tuple[Action, ...] = (
    *(Action(f"view_{v.id}", str(i + 1), "show_view", v.title, (v.id,), show=False) for i, v in enumerate(VIEWS)),
    Action("select_next", "down", "select", "Select next", (1,), show=False),
    Action("select_previous", "up", "select", "Select previous", (-1,), show=False),
    Action("select_gpu", "g", "select_gpu", "Next GPU", views=("overview",)),
    Action("select_server", "s", "select_server", "Next server", views=_SERVER_VIEWS),
    Action("server_start", "S", "server", "Start", ("start",), mode="live", views=("servers",)),
    Action("server_stop", "x", "server", "Stop", ("stop",), mode="live", views=("servers",)),
    Action("server_restart", "R", "server", "Restart", ("restart",), mode="live", views=("servers",)),
    Action("server_sleep", "z", "server", "Sleep (vLLM)", ("sleep",), mode="live", views=("servers",)),
    Action("server_wake", "w", "server", "Wake (vLLM)", ("wake",), mode="live", views=("servers",)),
    Action("edit_split", "t", "edit_split", "Split ratios", mode="live", views=_SERVER_VIEWS),
    Action("apply_plan", "p", "apply_plan", "Planned split", mode="live", views=_SERVER_VIEWS),
    Action("edit_share", "m", "edit_share", "Memory share", mode="live", views=_SERVER_VIEWS),
    Action("edit_shard", "m", "edit_shard", "Shard size", mode="live", views=("pools",)),
    Action("edit_knobs", "k", "edit_knobs", "Engine knobs", mode="live"),
    Action("save_knobs", "w", "save_knobs", "Save knobs to config", mode="live", views=("engine",)),
    Action("apply", "a", "apply", "Apply pending", mode="live", show=False),
    Action("discard", "escape", "discard", "Discard pending", mode="live", show=False),
    Action("toggle_recording", "r", "toggle_recording", "Recording", mode="live"),
    Action("export", "e", "export", "Export session", views=("history",)),
    Action("sort_processes", "o", "sort_processes", "Sort order", views=("processes",)),
    Action("filter_processes", "slash", "filter_processes", "Filter", views=("processes",)),
    Action("replay_pause", "space", "replay_pause", "Pause/play", mode="replay"),
    Action("replay_step", "full_stop", "replay_step", "Step one tick", mode="replay"),
    Action("replay_back", "left_square_bracket", "replay_seek", "Seek back", (-1,), mode="replay"),
    Action("replay_forward", "right_square_bracket", "replay_seek", "Seek forward", (1,), mode="replay"),
    Action("replay_slower", "minus", "replay_speed", "Slower", (False,), mode="replay"),
    Action("replay_faster", "plus,equals_sign", "replay_speed", "Faster", (True,), mode="replay"),
    Action("help", "question_mark", "help", "Help", show=False),
    Action("quit", "q", "quit", "Quit", show=False),
)
"""`help` and `quit` are not in the per-tab list: the footer pins them to its right end."""

BY_ID: dict[str, Action] = {a.id: a for a in ACTIONS}
# What Textual hands check_action: the method name and the parsed arguments.
BY_CALL: dict[tuple[str, tuple[object, ...]], list[Action]] = {}
for _a in ACTIONS:
    BY_CALL.setdefault((_a.method, _a.args), []).append(_a)

PINNED = (BY_ID["help"], BY_ID["quit"])


def bindings() -> list[Binding]:
    return [a.binding() for a in ACTIONS]
