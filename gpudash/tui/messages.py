"""Typed messages: the only way threads (the sampler's sink, workers) hand results to the UI thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

from gpudash.config import ServerSpec


class SnapshotsPending(Message):
    """New snapshots wait in the app's inbox queue; the handler drains them all and renders once.

    Any number of these collapse into one while the UI is busy (toolong's `can_replace`), so a fast
    sampler never floods the message queue and no snapshot (with its events) is dropped.
    """

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotsPending)


@dataclass
class FeedStarted(Message):
    """The data source is running (sampler started, or the recorded session is loaded)."""

    info: Any  # gpudash.runtime.feed.FeedInfo


class FeedClosed(Message):
    """Everything the feed started has stopped; the app may exit."""


@dataclass
class SpecsChanged(Message):
    """The launcher's server specs (after start, or after a re-launch)."""

    specs: dict[str, ServerSpec]


@dataclass
class KnobsChanged(Message):
    """The transfer engine's current knob values."""

    knobs: dict[str, Any]


@dataclass
class Applied(Message):
    """A control command went through Controller.apply; `ok` False means refused with `reason`."""

    ok: bool
    reason: str | None
    summary: str


@dataclass
class Problem(Message):
    """Something the feed could not do (e.g. a server that did not start); shown, the app goes on."""

    what: str
    text: str


@dataclass
class LogTail(Message):
    """The last lines of one server's log, fetched off the UI thread."""

    server: str
    lines: list[str]
    rechain: bool = True  # schedule the next fetch (False for a one-off after a selection change)


@dataclass
class SessionsLoaded(Message):
    """Recorded sessions from the store (History view)."""

    sessions: list[Any]


@dataclass
class Exported(Message):
    """A session was exported; `text` says where (or why not)."""

    ok: bool
    text: str


@dataclass
class ModelSizes(Message):
    """Model file sizes per server (bytes), read off the UI thread for the split planner."""

    sizes: dict[str, int]


@dataclass
class KnobsSaved(Message):
    """Engine knobs were written into the config file (`ok`), or why not (`text`)."""

    ok: bool
    text: str
    knobs: dict[str, Any]


@dataclass
class Propose(Message):
    """A view's change for the app to apply, or to confirm first when it re-launches a server (`confirmed`:
    a dialog that said what it does was answered already)."""

    command: Any  # gpudash.runtime.control.Command
    confirmed: bool = False


@dataclass
class WorkerFailed(Message):
    """A view's worker failed; it bubbles to the app, the one place that reports worker errors."""

    name: str
    error: BaseException | None


@dataclass
class ProcessInfo(Message):
    """Users and commands of processes, looked up off the UI thread (gpudash.tui.procinfo)."""

    info: dict[int, Any]  # pid -> ProcInfo


@dataclass
class FleetRead(Message):
    """One read of the fleet through Prometheus (gpudash.fleet), or the one line saying why it failed."""

    fleet: Any  # gpudash.fleet.boxes.Fleet, None when the read failed
    error: str | None


@dataclass
class BoxHistory(Message):
    """The last hour of one box's per-GPU series (gpudash.fleet.boxes.read_box_history), or why not."""

    instance: str
    series: dict[str, dict[str, list[tuple[float, float]]]] | None
    error: str | None
    box: Any = None  # the box read again with its servers' figures (gpudash.fleet.boxes.FleetBox)


@dataclass
class CpuBuilds(Message):
    """{server: its llama-server binary} for the servers whose llama.cpp build has no GPU backend."""

    builds: dict[str, str]
