"""gpudash's multipath host<->GPU transfer engine (MMA design); a library that stands alone.

    from engine import TransferEngine, EngineConfig, EngineError
"""

from engine.buffers import DeviceBuffer, HostBuffer
from engine.config import EngineConfig
from engine.errors import EngineArgumentError, EngineError
from engine.pools import MemoryPool, PoolBlock, PoolError, PoolExhaustedError, ShardStats, engine_pools
from engine.results import CopyInfo, EngineStats, GpuInfo, LinkStats, PathStats, Topology
from engine.transfer import CopyHandle, TransferEngine

__all__ = [
    "CopyHandle", "CopyInfo", "DeviceBuffer", "EngineArgumentError", "EngineConfig", "EngineError",
    "EngineStats", "GpuInfo", "HostBuffer", "LinkStats", "PathStats", "Topology", "TransferEngine",
    "MemoryPool", "PoolBlock", "PoolError", "PoolExhaustedError", "ShardStats", "engine_pools",
]
