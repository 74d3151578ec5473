"""Topology facts for every sim profile, as the advisor consumes them."""

from __future__ import annotations

import dataclasses

import pytest

from gpudash.engine.profiles import PROFILES
from gpudash.telemetry.rig import read_topology
from gpudash.telemetry.topology import GpuFacts, TopologyFacts

GiB = 2**30


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_sim_topology_matches_profile(profile: str) -> None:
    rig = PROFILES[profile]
    facts = read_topology(f"sim:{profile}")
    assert isinstance(facts, TopologyFacts) and facts.is_sim and facts.source == f"sim:{profile}"
    assert [g.index for g in facts.gpus] == list(range(len(rig.gpus)))
    for g, spec in zip(facts.gpus, rig.gpus):
        assert (g.name, g.memory_total, g.bar1_total) == (spec.name, spec.memory_bytes, spec.bar1_bytes)
        assert (g.link_gen, g.link_width) == (g.link_gen_max, g.link_width_max) == (spec.link_gen, spec.link_width)
        assert g.compute_capability == spec.compute_capability and g.numa_node == spec.numa_node
        assert g.memory_free == g.memory_total and not g.link_degraded
        assert g.uuid.startswith("GPU-sim-")
    n = len(rig.gpus)
    assert all(facts.p2p[i][i] == "X" for i in range(n))
    assert all(len(row) == n for row in facts.p2p)
    assert facts.nvlink == (rig.nvlink_gbps is not None)
    assert facts.numa_nodes == rig.numa_nodes
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.nvlink = True  # type: ignore[misc]


def test_profile_specifics() -> None:
    mixed = read_topology("sim:rtx5080+rtx3090")
    assert [g.compute_capability for g in mixed.gpus] == [(12, 0), (8, 6)]
    assert [(g.memory_total // GiB, g.link_gen, g.link_width) for g in mixed.gpus] == [(16, 4, 8), (24, 4, 8)]
    assert mixed.p2p == (("X", "NS"), ("NS", "X")) and not mixed.nvlink
    h20 = read_topology("sim:8xh20")
    assert len(h20.gpus) == 8 and h20.nvlink and h20.numa_nodes == 2
    assert {g.numa_node for g in h20.gpus[:4]} == {0} and {g.numa_node for g in h20.gpus[4:]} == {1}
    assert all(c in ("X", "OK") for row in h20.p2p for c in row)
    (h200,) = read_topology("sim:h200").gpus
    assert h200.memory_total == 141 * GiB and (h200.link_gen, h200.link_width) == (5, 16)


def test_link_degraded_flag() -> None:
    g = GpuFacts(0, "x", "u", None, None, None, 4, 4, 4, 8, 0, (8, 6))
    assert g.link_degraded
    assert not dataclasses.replace(g, link_width=8).link_degraded
    assert not dataclasses.replace(g, link_width=None).link_degraded


@pytest.mark.parametrize("label", ["sim:nope", "bogus"])
def test_bad_label(label: str) -> None:
    with pytest.raises(ValueError, match="sim profile|telemetry source"):
        read_topology(label)
