"""Frozen results the engine hands out (built from the C layer's raw structs, like psutil does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class PathStats:
    """One path in one direction. `name` is ``direct:G`` or ``relay:A->B`` (A->B in data-flow order);
    `gpu` is the GPU whose memory is read or written, `via` the relay GPU (None for the direct path).
    `gbps` is the rate over about the last second, in 10**9 B/s of the backend clock (sim time on sim);
    `cpu_s` the CPU seconds the engine's threads spent on this path."""

    name: str
    gpu: int
    via: int | None
    direction: str
    bytes: int
    chunks: int
    queue_depth: int
    gbps: float
    cpu_s: float
    failed: bool = False


@dataclass(frozen=True, slots=True)
class LinkStats:
    """Cumulative payload bytes over one GPU's own host link (direct and relayed traffic)."""

    gpu: int
    h2d_bytes: int
    d2h_bytes: int


@dataclass(frozen=True, slots=True)
class EngineStats:
    backend: str
    time_s: float  # backend clock (sim seconds on sim)
    paths: tuple[PathStats, ...]
    links: tuple[LinkStats, ...]
    knobs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    link_gen: int | None
    link_width: int | None
    link_gen_max: int | None
    link_width_max: int | None
    link_gbps: float | None  # per-direction payload bandwidth of the host link (sim model); None: unknown


@dataclass(frozen=True, slots=True)
class Topology:
    backend: str  # "sim" or "cuda"
    profile: str | None
    gpus: tuple[GpuInfo, ...]
    paths: tuple[str, ...]
    peer: tuple[tuple[float | None, ...], ...]  # peer[a][b]: GB/s a->b; 0.0 P2P of unknown rate; None: none


class CopyInfo(NamedTuple):
    """What a finished copy did: its chunks and how many paths carried them (a NamedTuple: one is
    built for every copy, small ones included)."""

    direction: str
    gpu: int
    nbytes: int
    host_mode: str  # "pinned" | "registered" | "staged" | "driver" (pageable memory, one driver copy)
    chunks: int
    paths_used: int
