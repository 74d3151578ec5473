"""The rig is a typed object: its label is written and read in gpudash/labels.py and gpudash/telemetry/rig.py alone,
and each kind makes its own engine configuration, sources and topology."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudash.config import Config, validate
from gpudash.labels import is_sim_label, sim_profile_of
from gpudash.telemetry.rig import NvmlRig, SimulatedRig, read_topology, rig_of

REPO = Path(__file__).resolve().parent.parent
LABEL_PARSE = re.compile(r'startswith\("sim:"\)|removeprefix\("sim:"\)|"sim:" in|split\("sim:"')
LABEL_MADE = re.compile(r'f"sim:\{')


def test_labels_round_trip_through_the_one_parser() -> None:
    assert rig_of("nvml") == NvmlRig() and rig_of("nvml").label == "nvml" and not rig_of("nvml").is_sim
    rig = rig_of("sim:8xh20")
    assert rig == SimulatedRig("8xh20") and (rig.label, rig.profile, rig.is_sim) == ("sim:8xh20", "8xh20", True)
    assert rig_of(rig) is rig and str(rig) == "sim:8xh20"
    assert [sim_profile_of(x) for x in ("sim:h200", "nvml", "cuda", "replay:3 (sim:h200)")] == ["h200", None, None,
                                                                                               None]
    assert is_sim_label("sim:h200") and not is_sim_label("cuda")


@pytest.mark.parametrize("label, match", [("bogus", "expected 'nvml' or 'sim:<profile>'"),
                                          ("sim:nope", "unknown sim profile 'nope'")])
def test_a_bad_label_is_one_sentence(label: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rig_of(label)


def test_each_rig_configures_its_engine_with_the_config_knobs() -> None:
    cfg = validate({"engine": {"outstanding": 5}})
    sim = SimulatedRig("h200").engine_config(cfg)
    cuda = NvmlRig().engine_config(cfg)
    assert (sim.backend, sim.profile, sim.outstanding) == ("sim", "h200", 5)
    assert (cuda.backend, cuda.outstanding) == ("cuda", 5)


def test_a_sim_rig_makes_an_engine_and_its_gpu_source() -> None:
    from gpudash.telemetry.sim import SimRigSource

    rig = SimulatedRig("h200")
    source = rig.gpu_source(Config(), None, None)  # no engine given: it makes and owns one
    try:
        assert isinstance(source, SimRigSource) and source.label == rig.label
        assert source.engine.profile == "h200" and source.engine.backend == "sim"
        assert rig.topology(source).source == "sim:h200"
    finally:
        source.close()


def test_each_rig_reads_its_topology_and_gpu_memory() -> None:
    facts = read_topology("sim:8xh20")
    assert (facts.source, facts.is_sim, facts.profile, len(facts.gpus)) == ("sim:8xh20", True, "8xh20", 8)
    assert read_topology(SimulatedRig("8xh20")) == facts
    # a sim rig's servers run on the CPU: no GPU memory budget applies to them
    assert SimulatedRig("8xh20").gpu_memory_totals() == {}


def _lines(dirs: tuple[str, ...], pattern: re.Pattern[str], skip: str = "") -> list[str]:
    return [f"{p.relative_to(REPO)}:{n}" for d in dirs for p in sorted((REPO / d).rglob("*.py")) if p.name not in ("rig.py", "labels.py")
            and not (skip and p.is_relative_to(REPO / skip))
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]


def test_no_module_parses_or_makes_a_rig_label_but_labels_and_rig() -> None:
    assert _lines(("gpudash", "benchmarks"), LABEL_PARSE) == []
    # gpudash/engine/ stands alone: its repr says sim:<profile>
    assert _lines(("gpudash", "benchmarks"), LABEL_MADE, skip="gpudash/engine") == []
