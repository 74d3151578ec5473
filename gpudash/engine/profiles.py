"""Simulated rigs, taken from real boxes: the one definition the engine's sim backend and gpudash's
sim telemetry both read, so what the sim rig shows is caused by the bytes the sim links really move.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# PCIe raw rate per lane in GB/s (after line coding), by generation.
_PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# Share of the raw rate left for payload after TLP/DLLP overhead (H200 gen5 x16: 55 GB/s of 63).
PCIE_PAYLOAD_EFFICIENCY = 0.87


def pcie_payload_gbps(gen: int, width: int) -> float:
    """Payload bandwidth one direction of a PCIe link can carry, in GB/s (10**9 bytes/s)."""
    if gen not in _PCIE_LANE_GBPS or width <= 0:
        raise ValueError(f"unknown PCIe link gen{gen} x{width}")
    return _PCIE_LANE_GBPS[gen] * width * PCIE_PAYLOAD_EFFICIENCY


@dataclass(frozen=True, slots=True)
class SimGpu:
    """One simulated GPU and its host link."""

    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    link_gen: int
    link_width: int
    numa_node: int
    bar1_bytes: int
    mem_bw_gbps: float  # device memory bandwidth, GB/s
    bf16_tflops: float  # dense matmul rate
    power_limit_w: float
    link_latency_us: float = 2.0
    # What the card itself supports; link_gen/link_width are what its slot allows. None: the same.
    card_gen: int | None = None
    card_width: int | None = None

    @property
    def link_gbps(self) -> float:
        return pcie_payload_gbps(self.link_gen, self.link_width)


@dataclass(frozen=True, slots=True)
class SimRig:
    """A simulated box: its GPUs and how they reach each other."""

    name: str
    gpus: tuple[SimGpu, ...]
    p2p: bool  # peer-to-peer copies possible between every pair
    nvlink_gbps: float | None  # per-direction GPU<->GPU bandwidth over NVLink; None: no NVLink
    numa_nodes: int = 1

    def peer_gbps(self, a: int, b: int) -> float | None:
        """GB/s for a direct copy GPU a -> GPU b, or None when no direct peer path exists."""
        if a == b or not self.p2p:
            return None
        if self.nvlink_gbps is not None:
            return self.nvlink_gbps
        return min(self.gpus[a].link_gbps, self.gpus[b].link_gbps)


GiB = 2**30

# Both cards are x16 (the 5080 gen5, the 3090 gen4) in slots that split the CPU's lanes to gen4 x8 each.
_RTX5080 = SimGpu("NVIDIA GeForce RTX 5080", 16 * GiB, (12, 0), 4, 8, 0, 16 * GiB, 960.0, 56.3, 360.0,
                  card_gen=5, card_width=16)
_RTX3090 = SimGpu("NVIDIA GeForce RTX 3090", 24 * GiB, (8, 6), 4, 8, 0, 32 * GiB, 936.0, 35.6, 350.0,
                  card_gen=4, card_width=16)
_H20 = SimGpu("NVIDIA H20", 96 * GiB, (9, 0), 5, 16, 0, 128 * GiB, 4000.0, 148.0, 500.0)
_H200 = SimGpu("NVIDIA H200", 141 * GiB, (9, 0), 5, 16, 0, 256 * GiB, 4800.0, 989.0, 700.0)


def _h20(i: int) -> SimGpu:
    return replace(_H20, numa_node=0 if i < 4 else 1)


PROFILES: dict[str, SimRig] = {
    "rtx5080+rtx3090": SimRig("rtx5080+rtx3090", (_RTX5080, _RTX3090), p2p=False, nvlink_gbps=None),
    "8xh20": SimRig("8xh20", tuple(_h20(i) for i in range(8)), p2p=True, nvlink_gbps=450.0, numa_nodes=2),
    "h200": SimRig("h200", (_H200,), p2p=False, nvlink_gbps=None),
}


def get_profile(name: str) -> SimRig:
    """The named rig, or ValueError listing the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown sim profile {name!r}; choose one of: {', '.join(PROFILES)}") from None
