"""The transfer engine of a live run on real GPUs, made on first need.

The engine's CUDA backend creates a CUDA context on each GPU, about 520 MiB of VRAM held by gpudash for as
long as it runs (584 MiB with the default pools, measured on an H200), while watching needs none: nvitop
holds nothing. So a run on real GPUs starts its engine only when something needs it: a knob change, the
Engine or Pools view opened, pools written in the config file. Until then its knobs are the config's,
its stats have no paths and it has no pools; `start` makes it (once; a failure is kept and raised again).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from gpudash.engine.results import EngineStats

if TYPE_CHECKING:
    from gpudash.engine import TransferEngine
    from gpudash.engine.pools import EnginePool


class EngineOnDemand:
    """The part of TransferEngine a live run uses (knobs, set, stats, pools, close), over an engine made
    by `make` on first need; `started(engine)` runs once it exists (the run makes its pools there)."""

    def __init__(self, make: Callable[[], TransferEngine], knobs: dict[str, Any], backend: str,
                 started: Callable[[TransferEngine], None] | None = None) -> None:
        self._make, self._knobs, self._backend, self._on_start = make, dict(knobs), backend, started
        self._engine: TransferEngine | None = None
        self._failure: Exception | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def started(self) -> bool:
        return self._engine is not None

    def start(self) -> TransferEngine:
        """The engine, made now if it is not yet; the error of a failed start, again, on every later call."""
        with self._lock:
            if self._engine is not None:
                return self._engine
            if self._closed:
                raise RuntimeError("the run is closing; the transfer engine is not started")
            if self._failure is not None:
                raise self._failure
            try:
                engine = self._make()
            except Exception as err:  # noqa: BLE001 - kept, so a view switch does not retry a broken driver
                self._failure = err
                raise
            self._engine = engine
        if self._on_start is not None:
            self._on_start(engine)
        return engine

    def knobs(self) -> dict[str, Any]:
        engine = self._engine
        return engine.knobs() if engine is not None else dict(self._knobs)

    def set(self, **knobs: Any) -> dict[str, Any]:
        return self.start().set(**knobs)

    def stats(self) -> EngineStats:
        engine = self._engine
        if engine is not None:
            return engine.stats()
        return EngineStats(backend=self._backend, time_s=0.0, paths=(), links=(), knobs=dict(self._knobs))

    def pools(self) -> dict[str, EnginePool]:
        engine = self._engine
        return engine.pools() if engine is not None else {}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
