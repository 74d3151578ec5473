"""A live run, assembled the one way `launch`, `serve` and `record` use it.

A Run is the rig's Session (engine, pools, sources, sampler, recording) and, when it runs servers, the
LaunchStack (the configured servers, found ones or the demo; their supervisor, scraper and probe) and the
Controller over both, which every change from the keyboard or the CLI goes through. Building a Run checks
what a user can get wrong and starts nothing; `start` starts the sampling, `start_servers` the servers,
and `close` stops everything it started, servers first, so their stop events are recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from gpudash.config import Config
from gpudash.preload.knobs import PreloadKnobs
from gpudash.records import Snapshot
from gpudash.runtime.control import Controller
from gpudash.runtime.sd_notify import Notifier
from gpudash.runtime.session import Session
from gpudash.runtime.stack import LaunchStack
from gpudash.store import Store
from gpudash.telemetry.inbox import Inbox
from gpudash.telemetry.rig import Rig, rig_of
from gpudash.telemetry.sampler import Sampler

Sink = Callable[[Snapshot], None]


def check_store(path: Path) -> None:
    """StoreError (one sentence) when the database at `path` cannot be used: asked before a run starts
    anything, so a refused run leaves nothing behind."""
    Store.open(path).close()


def _no_gpu_pids() -> list[tuple[int, int]]:
    return []


class Run:
    """One live run over a rig; see the module docstring."""

    def __init__(self, config: Config, rig: Rig | str, db_path: Path, *, note: str = "", servers: bool = False,
                 live_engine: bool = False, pools: bool = False, log_dir: Path | None = None) -> None:
        """`servers`: run the LaunchStack (OSError when the demo's model cannot be written); `live_engine`: a
        transfer engine on real GPUs too (a sim rig always has one), made on first need, whose failure is a
        note, not an error; `pools`: the [pools] memory pools on that engine, sampled each tick."""
        self.config, self.rig = config, rig_of(rig)
        self.inbox = Inbox()
        self.stack: LaunchStack | None = None
        if servers:
            from gpudash.launcher.discovery import nvml_gpu_pids

            # a simulated rig's GPUs run no real process; its local servers are still found by command line
            self.stack = LaunchStack(config, self.inbox, log_dir, gpu_memory=self.rig.gpu_memory_totals,
                                     gpu_pids=_no_gpu_pids if self.rig.is_sim else nvml_gpu_pids)
        demo = " (demo)" if self.stack is not None and self.stack.demo else ""
        self.session = Session(self.rig, config, db_path, note=note + demo if note else "")
        self.controller: Controller | None = None
        self.sampler: Sampler | None = None
        self.notes: list[str] = []
        self._live_engine, self._pools = live_engine, pools
        self._notifier = Notifier.from_env()  # under systemd's Type=notify: ready, watchdog, stopping

    def start(self, sinks: Iterable[Sink], *, interval_s: float | None = None, record: bool = True) -> Sampler:
        """Start the engine (and pools), build the sources and the sampler, turn recording on (`record`),
        make the controller and start sampling. An engine or native library that will not start raises,
        unless the engine is `live_engine`, whose failure becomes a note."""
        session, stack = self.session, self.stack
        if self._notifier is not None:
            sinks = [*sinks, self._notifier.tick]  # the watchdog hears from the sampler's own thread
        session.start_engine(live=self._live_engine, pools=self._pools)
        self.notes.extend(session.notes)
        if stack is not None:
            self.notes.extend(stack.notes())
        self.sampler = session.wire(sinks, inbox=self.inbox, pids=stack.supervisor.pids if stack else None,
                                    sample_pools=self._pools, extra_sources=stack.sources if stack else (),
                                    interval_s=interval_s)
        if record:
            session.recording.set(True)
        self.controller = Controller(engine=session.engine, supervisor=stack.supervisor if stack else None,
                                     inbox=self.inbox, recorder=session.recording, pools=session.all_pools,
                                     preload=self._preload_knobs())
        self.sampler.start()
        if self._notifier is not None:
            self._notifier.ready(f"sampling {self.rig.label} every {self.sampler.interval_s:g} s")
        return self.sampler

    def _preload_knobs(self) -> PreloadKnobs | None:
        """Live knob changes for the supervised servers that run the engine preloaded."""
        if self.stack is None:
            return None
        supervisor = self.stack.supervisor
        return PreloadKnobs(self.inbox, supervisor.pids, remember=supervisor.preload_knobs.update)

    def start_servers(self) -> None:
        """Start the servers one after another, each healthy before the next (LaunchError on the first that
        fails; the ones before it keep running until `close`)."""
        if self.stack is not None:
            self.stack.start()

    def close(self, *, last_tick: bool = False) -> None:
        """Stop the servers (their stop events reach the inbox), then close the session: sampler, recording,
        pools, engine. `last_tick` records one more tick first, with the servers' stopped states. Safe to
        call twice; a failed store writer is raised last (StoreError)."""
        stack, self.stack = self.stack, None
        notifier, self._notifier = self._notifier, None
        if notifier is not None:
            notifier.stopping()
        try:
            if stack is not None:
                stack.close()
        finally:
            self.session.close(last_tick=last_tick)
