"""PreloadSource: the engines running inside preloaded processes (`gpudash run`, servers with
engine = "preload") as `engine_paths` samples tagged with the server's name.

Each process publishes cumulative counters in its stats block; the rate of a path is its byte delta
over the time between the two publishes this source read (the first sight of a path shows the rate the
process itself reports). Direct paths are always reported; relay paths once they carried bytes. A
server with several preloaded processes (vLLM's workers) gets one row per path, summed over them.
A path's CPU is the whole cost of its direction's taken copies (the calling threads' time inside them
and gpudash's own threads, idle spinning included; PreloadStats.cpu_s), shared out by bytes, so the
Engine view and gpudash_engine_path_cpu_seconds over bytes give core-seconds per GB.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from gpudash.preload import shm as P
from gpudash.engine.errors import EngineError
from gpudash.preload.knobs import Pids, preloaded
from gpudash.records import EnginePathSample

_Key = tuple[int, float, str, str]  # pid, the process's start time, path, direction


class PreloadSource:
    """Telemetry source over every live preloaded process's stats block."""

    name = "preload"

    def __init__(self, pids: Pids | None = None, shm_dir: Path = P.SHM_DIR) -> None:
        self._pids = pids
        self._shm_dir = shm_dir
        self._last: dict[_Key, tuple[float, int]] = {}  # key -> (published at, bytes)

    def poll(self) -> dict[str, tuple]:
        ts = time.time()
        rows: dict[tuple[str, str, str], EnginePathSample] = {}
        errors: list[str] = []
        seen: dict[_Key, tuple[float, int]] = {}
        for pid, name in preloaded(self._pids, self._shm_dir).items():
            try:
                with P.StatsView(pid, self._shm_dir) as view:
                    s = view.read()
            except EngineError as err:
                errors.append(f"preload: {name} (pid {pid}): {err}")
                continue
            for p, cpu_s in zip(s.paths, s.paths_cpu_s()):
                if p.via is not None and not (p.bytes or p.queue_depth):
                    continue
                key = (pid, s.started_at, p.name, p.direction)
                gbps = self._rate(self._last.get(key), s.updated_at, p.bytes, p.gbps)
                seen[key] = (s.updated_at, p.bytes)
                row = EnginePathSample(ts=ts, path=p.name, gpu=p.gpu, via=p.via, direction=p.direction,
                                       bytes_total=p.bytes, chunks_total=p.chunks, queue_depth=p.queue_depth,
                                       gbps=gbps, cpu_s=cpu_s, server=name)
                prior = rows.get((name, p.name, p.direction))
                rows[(name, p.name, p.direction)] = row if prior is None else _summed(prior, row)
        self._last = seen  # processes that are gone are forgotten
        return {"engine_paths": tuple(rows.values()), "errors": tuple(errors)}

    @staticmethod
    def _rate(last: tuple[float, int] | None, at: float, nbytes: int, reported: float) -> float:
        """GB/s between the last publish read and this one."""
        if last is None or nbytes < last[1]:
            return reported
        if at <= last[0]:  # nothing published since: no new bytes known
            return 0.0
        return (nbytes - last[1]) / (at - last[0]) / 1e9

    def close(self) -> None:
        """Nothing to release: each poll maps and unmaps the blocks it reads."""


def _summed(a: EnginePathSample, b: EnginePathSample) -> EnginePathSample:
    """One server's path over its processes (a vLLM server's workers each run an engine)."""
    return replace(a, bytes_total=a.bytes_total + b.bytes_total, chunks_total=a.chunks_total + b.chunks_total,
                   queue_depth=a.queue_depth + b.queue_depth, gbps=a.gbps + b.gbps, cpu_s=a.cpu_s + b.cpu_s)
