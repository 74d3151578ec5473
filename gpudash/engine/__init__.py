"""gpudash's multipath host<->GPU transfer engine (MMA design); a library that stands alone.

    from gpudash.engine import TransferEngine, EngineConfig, EngineError

Backends: "cuda" (the driver API, loaded at run time; shares the primary context with CuPy/PyTorch)
and "sim" (a rig from gpudash.engine.profiles whose links really move bytes between host buffers). The sim
runs `sim_time_scale` times slower than real time so the host's memcpy keeps up with the modelled
links; every time and rate it reports (EngineStats.time_s, PathStats.gbps, TransferEngine.now())
is in simulated seconds, and must be labelled sim wherever it is shown.
"""

from gpudash.engine.buffers import DeviceBuffer, HostBuffer
from gpudash.engine.config import EngineConfig
from gpudash.engine.errors import EngineArgumentError, EngineError
from gpudash.engine.pools import MemoryPool, PoolBlock, PoolError, PoolExhaustedError, ShardStats, engine_pools
from gpudash.engine.results import CopyInfo, EngineStats, GpuInfo, LinkStats, PathStats, Topology
from gpudash.engine.transfer import CopyHandle, TransferEngine

__all__ = [
    "CopyHandle", "CopyInfo", "DeviceBuffer", "EngineArgumentError", "EngineConfig", "EngineError",
    "EngineStats", "GpuInfo", "HostBuffer", "LinkStats", "PathStats", "Topology", "TransferEngine",
    "MemoryPool", "PoolBlock", "PoolError", "PoolExhaustedError", "ShardStats", "engine_pools",
]
