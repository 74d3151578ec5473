"""Builds the telemetry sources for one run: the rig's GPUs (NVML or a sim rig), the host, the engine's
paths when an engine is given, the preloaded servers' engines on real GPUs, and the inbox when one is given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpudash.config import Config
from gpudash.telemetry.rig import Rig, rig_of
from gpudash.telemetry.host import HostSource
from gpudash.telemetry.inbox import Inbox
from gpudash.telemetry.sampler import Source


def build_sources(rig: Rig | str, config: Config, *, inbox: Inbox | None = None, engine: Any = None,
                  pids: Callable[[], dict[int, str]] | None = None, pools: Callable[[], Any] | None = None) -> list[Source]:
    """Sources for a rig (or its label): its GPUs, the host, the engine's paths when an `engine` is given,
    the pools and the inbox. A sim rig without an `engine` gets its own sim engine, which it closes on
    close(); with one, the caller keeps owning it."""
    the_rig = rig_of(rig)
    sources: list[Source] = [the_rig.gpu_source(config, engine, pids)]
    sources.append(HostSource(pids))
    if not the_rig.is_sim:  # preloaded servers copy to real GPUs only; a sim session stays all sim
        from gpudash.preload.source import PreloadSource

        sources.append(PreloadSource(pids))
    if engine is not None:
        from gpudash.telemetry.engine import EngineSource

        sources.append(EngineSource(engine))
    if pools is not None:  # () -> the engine's MemoryPools: their slabs and shards, as pools / pool_shards
        from gpudash.telemetry.pools import PoolSource

        sources.append(PoolSource(pools))
    if inbox is not None:
        sources.append(inbox)
    return sources
