"""Topology facts the advisor (doctor, split planner) reasons about: GPUs, their links, P2P, NVLink.

`gpudash.telemetry.rig.read_topology(rig)` asks the rig for them: the real box is read through gpu/
(`nvml_topology`), a simulated one is built from gpudash/engine/profiles.py (`profile_topology`, with a live
`SimRigSource`'s degraded links when one is given). This module never imports the rig that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpudash.engine.profiles import get_profile
from gpudash.labels import NVML_LABEL, is_sim_label, sim_label, sim_profile_of, sim_uuid

if TYPE_CHECKING:
    from gpudash.telemetry.sim import SimRigSource


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One GPU as the advisor sees it. None: the driver could not say."""

    index: int
    name: str
    uuid: str
    memory_total: int | None
    memory_free: int | None
    bar1_total: int | None
    link_gen: int | None
    link_width: int | None
    link_gen_max: int | None
    link_width_max: int | None
    numa_node: int | None
    compute_capability: tuple[int, int] | None
    nvlink_links: int | None = None  # active NVLink links; None: no NVLink or unknown
    # What the card itself supports, whatever its slot allows (link_*_max is the lower of card and slot).
    card_gen: int | None = None
    card_width: int | None = None

    @property
    def link_degraded(self) -> bool:
        """True when the link trains below what GPU and slot allow (gen or width)."""
        return any(cur is not None and top is not None and cur < top
                   for cur, top in ((self.link_gen, self.link_gen_max), (self.link_width, self.link_width_max)))


@dataclass(frozen=True, slots=True)
class TopologyFacts:
    """The whole box. `p2p[a][b]` is coded like `nvidia-smi topo -p2p r`: X, OK, NS, GNS, CNS, TNS, U."""

    source: str  # the rig's label
    gpus: tuple[GpuFacts, ...]
    p2p: tuple[tuple[str, ...], ...]
    nvlink: bool
    numa_nodes: int | None

    @property
    def is_sim(self) -> bool:
        return is_sim_label(self.source)

    @property
    def profile(self) -> str | None:
        """The sim profile these facts were built from; None for a real box."""
        return sim_profile_of(self.source)


def nvml_topology() -> TopologyFacts:
    """The real box's facts, read through NVML."""
    from gpudash.gpu import nvml
    from gpudash.gpu.device import devices, p2p_matrix
    from gpudash.telemetry.host import numa_node_count

    reason = nvml.driver_available()
    if reason is not None:
        raise RuntimeError(f"cannot read the GPU topology: {reason}")
    devs = devices()
    gpus = []
    for d in devs:
        st = d.static
        sample = d.sample(0.0, None, None)
        gpus.append(GpuFacts(
            index=st.index, name=st.name, uuid=st.uuid, memory_total=st.memory_total,
            memory_free=d.memory_free(), bar1_total=st.bar1_total,
            link_gen=sample.link_gen, link_width=sample.link_width,
            link_gen_max=st.link_gen_max, link_width_max=st.link_width_max,
            numa_node=st.numa_node, compute_capability=st.compute_capability,
            nvlink_links=d.nvlink_active_links(), card_gen=st.card_gen, card_width=st.card_width,
        ))
    return TopologyFacts(source=NVML_LABEL, gpus=tuple(gpus), p2p=p2p_matrix(devs),
                         nvlink=any(g.nvlink_links for g in gpus), numa_nodes=numa_node_count())


def profile_topology(profile: str, sim: SimRigSource | None) -> TopologyFacts:
    """A simulated rig's facts from its profile, with `sim`'s live link state when given."""
    rig = get_profile(profile)
    gpus = []
    for i, g in enumerate(rig.gpus):
        gen, width = sim.link(i) if sim is not None else (g.link_gen, g.link_width)
        used = sim.memory_used(i) if sim is not None else 0
        gpus.append(GpuFacts(
            index=i, name=g.name, uuid=sim_uuid(profile, i), memory_total=g.memory_bytes,
            memory_free=g.memory_bytes - used, bar1_total=g.bar1_bytes,
            link_gen=gen, link_width=width, link_gen_max=g.link_gen, link_width_max=g.link_width,
            numa_node=g.numa_node, compute_capability=g.compute_capability,
            card_gen=g.card_gen or g.link_gen, card_width=g.card_width or g.link_width,
        ))
    n = len(rig.gpus)
    ok = "OK" if rig.p2p else "NS"
    p2p = tuple(tuple("X" if a == b else ok for b in range(n)) for a in range(n))
    return TopologyFacts(source=sim_label(profile), gpus=tuple(gpus), p2p=p2p,
                         nvlink=rig.nvlink_gbps is not None, numa_nodes=rig.numa_nodes)

