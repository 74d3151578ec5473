"""The link check under a real engine load on sim rigs: the sim engine moves real bytes over its
modelled links, and a link trained down through the sim rig source shows in both the facts and the rate."""

from __future__ import annotations

import pytest

from gpudash.engine import EngineConfig, TransferEngine
from gpudash.advisor.checks import check_link_under_load
from gpudash.advisor.gather import busy_topology, gather
from gpudash.config import Config
from gpudash.telemetry.sim import SimRigSource


@pytest.fixture
def rig():
    engine = TransferEngine(EngineConfig(backend="sim", profile="rtx5080+rtx3090"))
    source = SimRigSource("rtx5080+rtx3090", engine)
    yield source
    source.close()
    engine.close()


def test_healthy_links_under_load_warn_that_the_slots_hold_the_cards_back(rig: SimRigSource) -> None:
    facts = gather("sim:rtx5080+rtx3090", Config(), sim=rig, load_s=0.3)
    assert facts.busy is not None and len(facts.busy) == 2
    for load in facts.busy:
        assert load.expected_gbps == pytest.approx(13.7, abs=0.1)
        assert 0.5 * load.expected_gbps < load.gbps <= 1.05 * load.expected_gbps
    r = check_link_under_load(facts)
    assert r.status == "warn" and "GPU 0, 1" in r.fix  # x16 cards in gen4 x8 slots: trained as allowed, not full


def test_degraded_link_fails_and_carries_half(rig: SimRigSource) -> None:
    rig.degrade_link(1, width=4)
    facts = gather("sim:rtx5080+rtx3090", Config(), sim=rig, load_s=0.3)
    gpu1 = facts.topology.gpus[1]
    assert (gpu1.link_gen, gpu1.link_width, gpu1.link_width_max) == (4, 4, 8)
    rates = {b.gpu: b.gbps for b in facts.busy}
    assert rates[1] < 0.65 * rates[0]  # x4 carries about half of x8
    r = check_link_under_load(facts)
    assert r.status == "fail" and "GPU 1" in r.fix
    rig.restore_link(1)
    assert check_link_under_load(gather("sim:rtx5080+rtx3090", Config(), sim=rig, load_s=0.2)).status == "warn"


def test_engine_load_that_fails_is_a_skip_with_the_reason() -> None:
    engine = TransferEngine(EngineConfig(backend="sim", profile="h200"))
    engine.close()  # every copy and allocation is refused now
    topo, loads, note = busy_topology("sim:h200", Config(), engine=engine)
    assert loads is None and note.startswith("the engine load failed") and topo.source == "sim:h200"
    facts = gather("sim:h200", Config(), engine=engine)
    r = check_link_under_load(facts)
    assert r.status == "skip" and "engine load failed" in r.evidence[0]
