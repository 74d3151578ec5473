"""EngineSource: the transfer engine's per-path counters as `engine_paths` samples each tick.

Direct paths are always reported; relay paths only once they have carried bytes or hold chunks, so
an 8-GPU rig's 112 idle relay paths do not fill the store with zero rows.
"""

from __future__ import annotations

import time

from gpudash.engine import TransferEngine
from gpudash.records import EnginePathSample


class EngineSource:
    """Telemetry source over a TransferEngine the app owns (closing the source leaves the engine open)."""

    name = "engine"

    def __init__(self, engine: TransferEngine):
        self._engine = engine

    def poll(self) -> dict[str, tuple]:
        stats = self._engine.stats()
        ts = time.time()
        return {"engine_paths": tuple(
            EnginePathSample(ts=ts, path=p.name, gpu=p.gpu, via=p.via, direction=p.direction, bytes_total=p.bytes,
                             chunks_total=p.chunks, queue_depth=p.queue_depth, gbps=p.gbps, cpu_s=p.cpu_s)
            for p in stats.paths if p.via is None or p.bytes or p.queue_depth)}

    def close(self) -> None:
        """Nothing to release: the engine belongs to whoever created it."""
