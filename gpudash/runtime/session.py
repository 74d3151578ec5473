"""One live run's wiring, shared by `gpudash launch` (the dashboard's LiveFeed), `gpudash record` and
`gpudash serve`: the rig's engine -> the sources -> the sampler -> a store session that recording writes into.

`Session` owns what it starts and stops it in reverse order on close (the sampler, then the recording,
then the pools and the engine whose memory they use). Which rigs get an engine is decided here once:
a simulated rig always (its links are the sim engine's), a real one when the caller asks for a live
engine (the dashboard, whose knobs are live), and then only on first need (engine_on_demand.py): the
CUDA context holds about 520 MiB of VRAM that watching does not need. A headless recorder on real GPUs
starts none, so it holds no CUDA context or pinned pools on a box it only watches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudash.config import Config
from gpudash.telemetry.rig import Rig, rig_of

from gpudash.runtime.engine_on_demand import EngineOnDemand

if TYPE_CHECKING:
    from gpudash.engine import MemoryPool, TransferEngine
    from gpudash.records import Snapshot
    from gpudash.store import Store, StoreWriter
    from gpudash.telemetry.inbox import Inbox
    from gpudash.telemetry.sampler import Sampler, Source


class StoreRecording:
    """Recording switched on and off by attaching a store writer to the sampler (SetRecording's target).

    The store session is opened on first use and ended once, at `close`, so toggling never splits a run.
    """

    def __init__(self, db_path: Path, source: str, config: Config, note: str = "") -> None:
        self.db_path = db_path
        self._source, self._config, self._note = source, config, note
        self._sampler: Sampler | None = None
        self._store: Store | None = None
        self.writer: StoreWriter | None = None
        self.session_id: int | None = None
        self._on = False
        self._lock = threading.Lock()

    @property
    def on(self) -> bool:
        return self._on

    def attach(self, sampler: Sampler) -> None:
        self._sampler = sampler

    def set(self, on: bool) -> None:
        with self._lock:
            if on == self._on:
                return
            assert self._sampler is not None, "attach a sampler before recording"
            if on:
                writer = self._ensure_writer()
                self._sampler.add_sink(writer.submit)
            else:
                assert self.writer is not None
                self._sampler.remove_sink(self.writer.submit)
            self._on = on

    def _ensure_writer(self) -> StoreWriter:
        if self.writer is not None:
            return self.writer
        from gpudash.store import Store, StoreWriter
        from gpudash.store.retention import Retention

        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self._store = Store.open(self.db_path)
        self.session_id = self._store.begin_session(self._source, self._config, note=self._note)
        sc = self._config.store
        self.writer = StoreWriter(self.db_path, self.session_id, flush_interval_s=sc.flush_interval_s,
                                  queue_max=sc.queue_max, retention=Retention.from_config(sc))
        return self.writer

    def record_leftovers(self, drained: Mapping[str, tuple]) -> None:
        """Write what reached the inbox after the sampler stopped (e.g. the servers' stop events)."""
        if self._store is not None and self._on and self.session_id is not None:
            for e in drained.get("events", ()):
                self._store.record_event(self.session_id, e)
            self._store.insert_requests(self.session_id, drained.get("requests", ()))

    def close(self) -> None:
        """Flush the writer and end the session (once); a writer that failed is raised (StoreError) after
        the session is ended, which then holds the rows written before the failure."""
        with self._lock:
            writer, store, self.writer, self._store = self.writer, self._store, None, None
            if store is None or self.session_id is None:
                return
            with store:  # also when the writer never started: the session begun is ended, the file closed
                try:
                    if writer is not None:
                        writer.close()
                finally:
                    store.end_session(self.session_id)


class Session:
    """A rig's engine, sources, sampler and recording, wired the one way launch, record and serve use."""

    def __init__(self, rig: Rig | str, config: Config, db_path: Path, *, note: str = "") -> None:
        self.rig = rig_of(rig)
        self.config = config
        self.engine: TransferEngine | EngineOnDemand | None = None
        self.pools: dict[str, MemoryPool] = {}  # pools made here ([pools]); closed before the engine
        self.sampler: Sampler | None = None
        self.inbox: Inbox | None = None
        self.recording = StoreRecording(db_path, self.rig.label, config, note)
        self.notes: list[str] = []

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start_engine(self, live: bool, pools: bool = False) -> None:
        """Make the rig's engine when it needs one (a sim rig) or `live` asks for one, with the [pools]
        memory pools when `pools`. On real GPUs a live engine is made on first need (`want_engine`, a
        knob change), at once only where the config file sets [pools]; its failure becomes a note, or an
        error when the rig needs the engine."""
        if not (self.rig.is_sim or live):
            return
        if not self.rig.is_sim:
            self.engine = EngineOnDemand(lambda: self.rig.make_engine(self.config),
                                         self.rig.engine_config(self.config).knobs(), backend="cuda",
                                         started=self._make_pools if pools else None)
            if pools and "pools" in self.config.model_fields_set:
                self.want_engine()
            return
        self.engine = self.rig.make_engine(self.config)
        if pools:
            self._make_pools(self.engine)

    def want_engine(self) -> None:
        """Start an engine made on demand now (something needs it); a failure becomes a note, once."""
        if isinstance(self.engine, EngineOnDemand) and not self.engine.started:
            try:
                self.engine.start()
            except Exception as err:  # noqa: BLE001 - e.g. no CUDA driver library: say so, watch on
                note = f"transfer engine unavailable: {err}"
                if note not in self.notes:
                    self.notes.append(note)

    def _make_pools(self, engine: TransferEngine) -> None:
        """The [pools] memory pools on the engine (when both sizes are set); a failure is a note."""
        pc = self.config.pools
        if not (pc.host_bytes and pc.device_bytes):
            return
        from gpudash.engine.pools import engine_pools

        try:
            self.pools.update(engine_pools(engine, host_bytes=pc.host_bytes, device_bytes=pc.device_bytes,
                                           shards=pc.shards))
        except Exception as err:  # noqa: BLE001 - e.g. not enough memory: say so, run without pools
            self.notes.append(f"memory pools not created: {err}")

    def all_pools(self) -> dict[str, Any]:
        """The pools made here and the engine's own (its staging slots and relay buffers), by name; a name
        shows once (the pool made here wins a clash)."""
        out: dict[str, Any] = dict(self.pools)
        for name, pool in (self.engine.pools() if self.engine is not None else {}).items():
            out.setdefault(name, pool)
        return out

    def wire(self, sinks: Iterable[Callable[[Snapshot], None]], *, inbox: Inbox | None = None,
             pids: Callable[[], dict[int, str]] | None = None, sample_pools: bool = False,
             extra_sources: Iterable[Source] = (), interval_s: float | None = None) -> Sampler:
        """Build the sources and the sampler (not started; every `interval_s`, default [sampling]) and
        attach the recording to it."""
        from gpudash.telemetry.factory import build_sources
        from gpudash.telemetry.sampler import Sampler
        from gpudash.runtime.energy_watch import EnergyComparisons
        from gpudash.telemetry.server_energy import ServerEnergyMeter

        self.inbox = inbox
        pools = (lambda: list(self.all_pools().values())) if sample_pools else None
        sources = build_sources(self.rig, self.config, inbox=inbox, engine=self.engine, pids=pids, pools=pools)
        self.sampler = Sampler(sources + list(extra_sources), interval_s or self.config.sampling.interval_s,
                               self.rig.label,
                               sinks=list(sinks), source_timeout_s=self.config.sampling.source_timeout_s,
                               derive=[ServerEnergyMeter(), EnergyComparisons()])
        self.recording.attach(self.sampler)
        return self.sampler

    def close(self, *, last_tick: bool = False) -> None:
        """Stop the sampler, end the recording (with what the inbox still held), close the pools made
        here, then the engine. `last_tick` samples once more first, so that a state the caller has just
        changed (servers it stopped) is recorded as a tick. Safe to call twice; a failed store writer is
        raised last (StoreError)."""
        sampler, self.sampler = self.sampler, None
        engine, self.engine = self.engine, None
        pools, self.pools = self.pools, {}
        try:
            if sampler is not None:
                if last_tick:
                    sampler.poll_once()
                sampler.stop()
            if self.inbox is not None:
                self.recording.record_leftovers(self.inbox.poll())
            self.recording.close()
        finally:
            for pool in pools.values():  # before the engine that owns their memory
                pool.close()
            if engine is not None:
                engine.close()
