"""Builds the telemetry sources for one run: the GPUs (NVML or a sim rig), the host, the engine's
paths when an engine is given, and the inbox when one is given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpudash.config import Config
from gpudash.telemetry.host import HostSource
from gpudash.telemetry.inbox import Inbox
from gpudash.telemetry.sampler import Source


def sim_engine(profile: str, config: Config) -> Any:
    """A sim-backend TransferEngine for `profile` with the config's [engine] knobs."""
    from engine import EngineConfig, TransferEngine

    return TransferEngine(EngineConfig(**config.engine.model_dump(), backend="sim", profile=profile))


def build_sources(source_label: str, config: Config, *, inbox: Inbox | None = None, engine: Any = None,
                  pids: Callable[[], dict[int, str]] | None = None, pools: Callable[[], Any] | None = None) -> list[Source]:
    """Sources for `nvml` or `sim:<profile>`. A sim rig without an `engine` gets its own sim engine,
    which it closes on close(); with one, the caller keeps owning it."""
    sources: list[Source] = []
    if source_label == "nvml":
        from gpudash.telemetry.nvml import NvmlSource

        sources.append(NvmlSource(pids=pids))
    elif source_label.startswith("sim:"):
        from engine.profiles import get_profile
        from gpudash.telemetry.sim import SimRigSource

        profile = source_label.removeprefix("sim:")
        get_profile(profile)
        owns = engine is None
        rig_engine = sim_engine(profile, config) if owns else engine
        try:
            sources.append(SimRigSource(profile, rig_engine, load=config.sim.load, owns_engine=owns))
        except Exception:
            if owns:
                rig_engine.close()
            raise
    else:
        raise ValueError(f"unknown telemetry source {source_label!r}; expected 'nvml' or 'sim:<profile>'")
    sources.append(HostSource(pids))
    if source_label == "nvml":  # preloaded servers copy to real GPUs only; a sim session stays all sim
        from gpudash.telemetry.preload import PreloadSource

        sources.append(PreloadSource(pids))
    if engine is not None:
        from gpudash.telemetry.engine import EngineSource

        sources.append(EngineSource(engine))
    if pools is not None:  # () -> the engine's MemoryPools; their shards become pool_shards samples
        from gpudash.telemetry.pools import PoolSource

        sources.append(PoolSource(pools))
    if inbox is not None:
        sources.append(inbox)
    return sources
