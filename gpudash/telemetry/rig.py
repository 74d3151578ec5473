"""The rig gpudash watches: the real box through NVML, or a simulated one built from an engine profile.

Each kind is a small typed class behind one contract (its label, whether it is simulated, its profile,
the GPU source it samples, the engine it makes, its topology), so no module parses a label to decide
what to do. The text label ("nvml", "sim:<profile>", gpudash/labels.py) is what sessions, snapshots and
exports store; `rig_of` is the one place that reads it back and `SimulatedRig.label` the one place that
writes it.

The rig sits above the telemetry sources it builds (nvml.py, sim.py, topology.py beside it), which never import it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpudash.labels import NVML_LABEL, sim_label, sim_profile_of

if TYPE_CHECKING:
    from gpudash.config import Config
    from gpudash.engine import EngineConfig, TransferEngine
    from gpudash.telemetry.sampler import Source
    from gpudash.telemetry.sim import SimRigSource
    from gpudash.telemetry.topology import TopologyFacts


class Rig(ABC):
    """What every kind of rig provides."""

    label: str
    is_sim: bool
    profile: str | None

    @abstractmethod
    def engine_config(self, config: Config) -> EngineConfig:
        """The EngineConfig for this rig's transfer engine, with the config's [engine] knobs."""

    def make_engine(self, config: Config) -> TransferEngine:
        """A transfer engine for this rig (the caller closes it)."""
        from gpudash.engine import TransferEngine

        return TransferEngine(self.engine_config(config))

    @abstractmethod
    def gpu_source(self, config: Config, engine: TransferEngine | None,
                   pids: Callable[[], dict[int, str]] | None) -> Source:
        """The telemetry source of this rig's GPUs."""

    @abstractmethod
    def topology(self, sim: SimRigSource | None = None) -> TopologyFacts:
        """The advisor's facts about this rig's GPUs and links."""

    @abstractmethod
    def gpu_memory_totals(self) -> dict[int, int]:
        """{index: total bytes} of the rig's real GPUs, for the launcher's llama.cpp memory budget."""

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class NvmlRig(Rig):
    """The GPUs of this machine, read through NVML; its engine runs on the CUDA backend."""

    label: str = NVML_LABEL
    is_sim: bool = False
    profile: str | None = None

    def engine_config(self, config: Config) -> EngineConfig:
        from gpudash.engine import EngineConfig

        return EngineConfig(**config.engine.model_dump(), backend="cuda")

    def gpu_source(self, config: Config, engine: TransferEngine | None,
                   pids: Callable[[], dict[int, str]] | None) -> Source:
        from gpudash.telemetry.nvml import NvmlSource

        return NvmlSource(pids=pids)

    def topology(self, sim: SimRigSource | None = None) -> TopologyFacts:
        from gpudash.telemetry.topology import nvml_topology

        return nvml_topology()

    def gpu_memory_totals(self) -> dict[int, int]:
        return {g.index: g.memory_total for g in self.topology().gpus if g.memory_total}


@dataclass(frozen=True)
class SimulatedRig(Rig):
    """A simulated rig from gpudash/engine/profiles.py; its links are the sim engine's, which move real bytes."""

    profile: str
    is_sim: bool = True

    def __post_init__(self) -> None:
        from gpudash.engine.profiles import get_profile

        get_profile(self.profile)  # an unknown profile fails here, naming the known ones

    @property
    def label(self) -> str:  # type: ignore[override]
        return sim_label(self.profile)

    def engine_config(self, config: Config) -> EngineConfig:
        from gpudash.engine import EngineConfig

        return EngineConfig(**config.engine.model_dump(), backend="sim", profile=self.profile)

    def gpu_source(self, config: Config, engine: TransferEngine | None,
                   pids: Callable[[], dict[int, str]] | None) -> Source:
        """The sim rig's source over `engine`, or over an engine of its own (closed with the source)."""
        from gpudash.telemetry.sim import SimRigSource

        owns = engine is None
        rig_engine = self.make_engine(config) if engine is None else engine
        try:
            return SimRigSource(self.profile, rig_engine, load=config.sim.load, owns_engine=owns, pids=pids,
                                placement=sim_placement(config, self.profile))
        except Exception:
            if owns:
                rig_engine.close()
            raise

    def topology(self, sim: SimRigSource | None = None) -> TopologyFacts:
        from gpudash.telemetry.topology import profile_topology

        return profile_topology(self.profile, sim)

    def gpu_memory_totals(self) -> dict[int, int]:
        """Empty: a sim rig's servers run on the CPU, so no llama.cpp memory budget applies to them."""
        return {}


def sim_placement(config: Config, profile: str) -> dict[str, tuple[int, ...]]:
    """Server -> the sim GPUs it is configured on (its `gpus`, else every GPU of the profile)."""
    from gpudash.engine.profiles import get_profile
    from gpudash.launcher.shares import server_gpus

    every = range(len(get_profile(profile).gpus))
    return {s.name: tuple(server_gpus(s, every)) for s in config.servers}


def rig_of(label: str | Rig) -> Rig:
    """The rig a label names ("nvml" or "sim:<profile>"); a Rig is returned as it is. ValueError for
    any other label or an unknown profile."""
    if isinstance(label, Rig):
        return label
    if label == NVML_LABEL:
        return NvmlRig()
    profile = sim_profile_of(label)
    if profile is not None:
        return SimulatedRig(profile)
    raise ValueError(f"unknown telemetry source {label!r}; expected 'nvml' or 'sim:<profile>'")


def read_topology(rig: Rig | str, sim: SimRigSource | None = None) -> TopologyFacts:
    """Facts for a rig (or its label), with a live `sim` source's degraded links when given; ValueError
    for an unknown label or profile."""
    return rig_of(rig).topology(sim)
