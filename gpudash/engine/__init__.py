"""gpudash's multipath host<->GPU transfer engine (MMA design); a library that stands alone.

    from gpudash.engine import TransferEngine, EngineConfig, EngineError

Backends: "cuda" (the driver API, loaded at run time; shares the primary context with CuPy/PyTorch)
and "sim" (a rig from gpudash.engine.profiles whose links really move bytes between host buffers). The sim
runs `sim_time_scale` times slower than real time so the host's memcpy keeps up with the modelled
links; every time and rate it reports (EngineStats.time_s, PathStats.gbps, TransferEngine.now())
is in simulated seconds, and must be labelled sim wherever it is shown.

The names below are imported on first use (PEP 562): importing a light submodule (the knob table, the sim
profiles, the errors) does not pull in the copy machinery and numpy, which cost `gpudash run` and
`gpudash status` a third of a second before they did anything.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_WHERE = {
    "DeviceBuffer": "buffers", "HostBuffer": "buffers",
    "EngineConfig": "config",
    "EngineArgumentError": "errors", "EngineError": "errors",
    "MemoryPool": "pools", "PoolBlock": "pools", "PoolError": "pools", "PoolExhaustedError": "pools",
    "ShardStats": "pools", "engine_pools": "pools",
    "CopyInfo": "results", "EngineStats": "results", "GpuInfo": "results", "LinkStats": "results",
    "PathStats": "results", "Topology": "results",
    "CopyHandle": "transfer", "TransferEngine": "transfer",
}

__all__ = sorted(_WHERE)

if TYPE_CHECKING:
    from gpudash.engine.buffers import DeviceBuffer, HostBuffer
    from gpudash.engine.config import EngineConfig
    from gpudash.engine.errors import EngineArgumentError, EngineError
    from gpudash.engine.pools import MemoryPool, PoolBlock, PoolError, PoolExhaustedError, ShardStats, engine_pools
    from gpudash.engine.results import CopyInfo, EngineStats, GpuInfo, LinkStats, PathStats, Topology
    from gpudash.engine.transfer import CopyHandle, TransferEngine


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
