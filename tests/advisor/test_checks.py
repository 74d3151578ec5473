"""Every doctor check made to pass and made to warn or fail, over sim-rig topology facts."""

from __future__ import annotations

import dataclasses

import pytest

from gpudash.advisor import checks
from gpudash.advisor.facts import CpuPlacement, DoctorFacts, LinkLoad
from gpudash.launcher.llama.build_info import LlamaBuild
from gpudash.config import ServerSpec
from gpudash.telemetry.rig import read_topology
from gpudash.telemetry.topology import TopologyFacts

MIB = 2**20


def facts(profile: str = "rtx5080+rtx3090", *, nodes: frozenset[int] = frozenset({0}), real: bool = False,
          **kw) -> DoctorFacts:
    """Facts over a sim profile's topology; `real` labels the same GPUs as NVML would report them, for
    the checks that a simulated rig skips (llama.cpp builds, NCCL)."""
    topo = kw.pop("topology", read_topology(f"sim:{profile}"))
    if real:
        topo = dataclasses.replace(topo, source="nvml")
    return DoctorFacts(topology=topo, cpu=CpuPlacement(frozenset({0, 1}), nodes), **kw)


def with_gpu(topo: TopologyFacts, index: int, **changes) -> TopologyFacts:
    gpus = tuple(dataclasses.replace(g, **changes) if g.index == index else g for g in topo.gpus)
    return dataclasses.replace(topo, gpus=gpus)


def busy(topo: TopologyFacts, gbps: float = 12.0) -> tuple[LinkLoad, ...]:
    return tuple(LinkLoad(g.index, gbps, 13.7) for g in topo.gpus)


def vllm(name: str, gpus: list[int], **kw) -> ServerSpec:
    return ServerSpec(name=name, kind="vllm", model="m", gpus=gpus, **kw)


# --- PCIe link under load ---------------------------------------------------------------------------

def test_link_full_speed_under_load_passes() -> None:
    topo = read_topology("sim:8xh20")
    r = checks.check_link_under_load(facts(topology=topo, busy=busy(topo, 48.0)))
    assert r.status == "pass" and r.fix == ""
    assert any("gen5 x16 while copying, moving 48.0 GB/s" in ln for ln in r.evidence)


def test_gen5_x16_card_in_a_gen4_x8_slot_warns() -> None:
    """The RTX 5080 (a gen5 x16 card) trains at what its slot allows, gen4 x8: not full speed, a warning."""
    topo = read_topology("sim:rtx5080+rtx3090")
    assert (topo.gpus[0].card_gen, topo.gpus[0].card_width) == (5, 16)
    r = checks.check_link_under_load(facts(topology=topo, busy=busy(topo)))
    assert r.status == "warn" and "GPU 0, 1" in r.fix and "slot" in r.fix
    assert any("gen4 x8 while copying, moving 12.0 GB/s" in ln for ln in r.evidence)
    assert ("GPU 0 (NVIDIA GeForce RTX 5080): the card is gen5 x16 (54.8 GB/s); its slot allows gen4 x8 at most"
            in r.evidence)
    full = with_gpu(with_gpu(topo, 0, card_gen=4, card_width=8), 1, card_gen=None, card_width=None)
    assert checks.check_link_under_load(facts(topology=full, busy=busy(full))).status == "pass"


def test_link_below_max_under_load_fails() -> None:
    topo = with_gpu(read_topology("sim:rtx5080+rtx3090"), 1, link_width=4)
    r = checks.check_link_under_load(facts(topology=topo, busy=busy(topo, 6.0)))
    assert r.status == "fail"
    assert "GPU 1" in r.fix and "lspci" in r.fix
    assert any("GPU 1" in ln and "gen4 x4 while copying" in ln for ln in r.evidence)


def test_link_not_loaded_is_skipped_not_passed() -> None:
    r = checks.check_link_under_load(facts(busy=None, busy_note="no engine"))
    assert r.status == "skip" and "no engine" in r.evidence[0]


# --- resizable BAR ----------------------------------------------------------------------------------

def test_rebar_on_passes() -> None:
    assert checks.check_resizable_bar(facts()).status == "pass"


def test_small_bar1_warns() -> None:
    topo = with_gpu(read_topology("sim:rtx5080+rtx3090"), 0, bar1_total=256 * MIB)
    r = checks.check_resizable_bar(facts(topology=topo))
    assert r.status == "warn" and "Re-Size BAR" in r.fix and "GPU 0" in r.fix
    assert "BAR1 0.25 GiB for 16 GiB VRAM" in r.evidence[0]


# --- P2P --------------------------------------------------------------------------------------------

def test_p2p_all_ok_passes_and_shows_matrix() -> None:
    r = checks.check_p2p(facts("8xh20"))
    assert r.status == "pass" and "NVLink" in r.evidence[-1]
    assert r.evidence[1].split() == ["GPU0", "X", "OK", "OK", "OK", "OK", "OK", "OK", "OK"]


def test_p2p_ns_warns_with_meaning_for_relays_and_nccl() -> None:
    r = checks.check_p2p(facts("rtx5080+rtx3090"))
    assert r.status == "warn"
    assert r.evidence[1].split() == ["GPU0", "X", "NS"] and r.evidence[2].split() == ["GPU1", "NS", "X"]
    assert "no relays" in r.evidence[-1] and "NCCL" in r.evidence[-1]


def test_p2p_single_gpu_passes() -> None:
    assert checks.check_p2p(facts("h200")).status == "pass"


# --- NUMA -------------------------------------------------------------------------------------------

def test_gpus_on_engine_nodes_pass() -> None:
    r = checks.check_numa_affinity(facts("8xh20", nodes=frozenset({0, 1})))
    assert r.status == "pass" and r.evidence[1].startswith("GPU 0 on node 0") and "GPU 7 on node 1" in r.evidence[1]


def test_gpu_on_other_node_warns() -> None:
    r = checks.check_numa_affinity(facts("8xh20", nodes=frozenset({0})))
    assert r.status == "warn" and "GPU 4, 5, 6, 7" in r.fix and "numactl --cpunodebind=1" in r.fix


def test_numa_unknown_is_skipped() -> None:
    topo = dataclasses.replace(read_topology("sim:8xh20"), numa_nodes=None)
    assert checks.check_numa_affinity(facts(topology=topo, nodes=None)).status == "skip"
    unknown_gpus = dataclasses.replace(topo, gpus=tuple(dataclasses.replace(g, numa_node=-1) for g in topo.gpus))
    assert checks.check_numa_affinity(facts(topology=unknown_gpus)).status == "skip"
    assert checks.check_numa_ceiling(facts(topology=unknown_gpus)).status == "skip"


def test_single_numa_node_box_passes_both_numa_checks() -> None:
    topo = read_topology("sim:rtx5080+rtx3090")
    assert topo.numa_nodes == 1
    assert checks.check_numa_affinity(facts(topology=topo, nodes=None)).evidence[0].startswith("one NUMA node")
    assert checks.check_numa_ceiling(facts(topology=topo, nodes=None)).status == "pass"


def test_eight_gpus_across_nodes_hit_upi_ceiling() -> None:
    r = checks.check_numa_ceiling(facts("8xh20", nodes=frozenset({0, 1})))
    assert r.status == "warn" and r.evidence[0].startswith("8 of 8 GPUs")


def test_four_gpus_across_nodes_stay_under_ceiling() -> None:
    r = checks.check_numa_ceiling(facts("8xh20", nodes=frozenset({0})))
    assert r.status == "pass" and r.evidence[0].startswith("4 of 8 GPUs")


# --- shares and enforce-eager -----------------------------------------------------------------------

def test_shares_within_one_pass() -> None:
    servers = (vllm("a", [0], share=0.4), vllm("b", [0], share=0.5), vllm("c", [1]))
    r = checks.check_shares(facts(servers=servers))
    assert r.status == "pass"
    assert "GPU 0: a 0.4 (share) + b 0.5 (share) = 0.90" in r.evidence


def test_overcommitted_shares_fail() -> None:
    servers = (vllm("a", [0], share=0.6), vllm("b", [], gpu_memory_utilization=0.5),
               ServerSpec(name="l", model="m.gguf", gpus=[1], share=0.3))
    r = checks.check_shares(facts(servers=servers))
    assert r.status == "fail" and "GPU 0" in r.fix
    assert "GPU 0: a 0.6 (share) + b 0.5 (gpu_memory_utilization) = 1.10" in r.evidence


def test_three_vllm_without_enforce_eager_fail() -> None:
    servers = (vllm("a", [0], share=0.3), vllm("b", [0], share=0.3, enforce_eager=False),
               vllm("c", [0], share=0.3))
    r = checks.check_enforce_eager(facts(servers=servers))
    assert r.status == "fail" and "for b:" in r.fix


def test_three_vllm_with_eager_or_launcher_default_pass() -> None:
    servers = (vllm("a", [0], enforce_eager=True), vllm("b", [0]), vllm("c", [0], enforce_eager=True))
    r = checks.check_enforce_eager(facts(servers=servers))
    assert r.status == "pass" and "b (enforce_eager=unset, launcher adds it)" in r.evidence[0]


def test_two_vllm_without_eager_pass() -> None:
    servers = (vllm("a", [0], enforce_eager=False), vllm("b", [0], enforce_eager=False))
    assert checks.check_enforce_eager(facts(servers=servers)).status == "pass"


# --- llama.cpp compute capabilities -----------------------------------------------------------------

def build(sass=(86, 120), ptx=(120,), nccl=False, backend="cuda") -> LlamaBuild:
    return LlamaBuild(binary="/opt/llama-server", version="b1", backend=backend, sass_archs=sass,
                      ptx_archs=ptx, nccl=nccl, evidence="test")


def test_build_with_both_archs_passes() -> None:
    r = checks.check_llama_archs(facts(real=True, llama=build()))
    assert r.status == "pass" and "built for sm 86,120 + PTX 120" in r.evidence


def test_build_lacking_a_cc_fails_with_rebuild_flags() -> None:
    r = checks.check_llama_archs(facts(real=True, llama=build(sass=(86,), ptx=(86,))))
    # PTX 8.6 can be JIT-compiled for 12.0: a warning, not a failure
    assert r.status == "warn" and "GPU 0 only via PTX JIT" in r.evidence[0]
    r = checks.check_llama_archs(facts(real=True, llama=build(sass=(86,), ptx=())))
    assert r.status == "fail" and r.evidence[0] == "no code for GPU 0"
    assert 'CMAKE_CUDA_ARCHITECTURES="86;120"' in r.fix


def test_sass_of_lower_minor_same_major_runs() -> None:
    assert checks.check_llama_archs(facts(real=True, llama=build(sass=(80, 120), ptx=()))).status == "pass"


def test_cpu_build_fails_and_unknown_archs_warn() -> None:
    assert checks.check_llama_archs(facts(real=True, llama=build(sass=(), ptx=(), backend="cpu"))).status == "fail"
    assert checks.check_llama_archs(facts(real=True, llama=build(sass=None, ptx=None))).status == "warn"
    assert checks.check_llama_archs(facts(real=True, llama=None, llama_note="not found")).status == "skip"


# --- NCCL on mixed consumer cards -------------------------------------------------------------------

def test_nccl_build_on_mixed_consumer_pair_warns() -> None:
    r = checks.check_nccl_mixed(facts(real=True, llama=build(nccl=True)))
    assert r.status == "warn" and "-DGGML_CUDA_NCCL=OFF" in r.fix
    assert "GPU 0+1 (GeForce RTX 5080 + GeForce RTX 3090, P2P NS)" in r.evidence[0]


def test_vllm_tensor_parallel_on_mixed_pair_warns() -> None:
    servers = (vllm("tp", [0, 1], tensor_parallel_size=2),)
    r = checks.check_nccl_mixed(facts(real=True, llama=build(nccl=False), servers=servers))
    assert r.status == "warn" and "vLLM server tp" in r.evidence[1]


def test_nccl_off_or_homogeneous_passes() -> None:
    assert checks.check_nccl_mixed(facts(real=True, llama=build(nccl=False))).status == "pass"
    assert checks.check_nccl_mixed(facts("8xh20", real=True, llama=build(nccl=True))).status == "pass"
    p2p = (("X", "OK"), ("OK", "X"))
    topo = dataclasses.replace(read_topology("sim:rtx5080+rtx3090"), p2p=p2p)
    assert checks.check_nccl_mixed(facts(topology=topo, real=True, llama=build(nccl=True))).status == "pass"


# --- runner -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("servers,code", [((), 0), ((vllm("a", [0], share=0.7), vllm("b", [0], share=0.7)), 1)])
def test_exit_code_is_one_only_when_a_check_fails(servers, code) -> None:
    topo = read_topology("sim:rtx5080+rtx3090")
    results = checks.run_checks(facts(topology=topo, busy=busy(topo), servers=servers, llama=build()))
    assert [r.check for r in results] == ["link_busy", "rebar", "p2p", "numa_affinity", "numa_ceiling",
                                          "shares", "enforce_eager", "llama_builds", "llama_archs", "nccl_mixed",
                                          "prompt_cache"]
    assert checks.exit_code(results) == code
    assert {r.status for r in results} <= {"pass", "warn", "fail", "skip"}


def test_a_simulated_rig_skips_the_checks_that_need_real_gpus_and_says_why() -> None:
    """On a sim rig a CPU-only llama-server is no failure: builds and NCCL are about real GPUs."""
    cpu = build(sass=(), ptx=(), backend="cpu", nccl=True)
    topo = read_topology("sim:rtx5080+rtx3090")
    results = {r.check: r for r in checks.run_checks(facts(topology=topo, busy=busy(topo), llama=cpu))}
    for name in ("llama_archs", "nccl_mixed"):
        assert results[name].status == "skip", results[name]
        assert results[name].evidence[0].startswith("simulated rig (sim:rtx5080+rtx3090): its GPUs are modelled")
    assert checks.exit_code(list(results.values())) == 0
    real = {r.check: r.status for r in checks.run_checks(facts(topology=topo, busy=busy(topo), llama=cpu, real=True))}
    assert real["llama_archs"] == "fail" and real["nccl_mixed"] == "warn"  # the same facts on real GPUs
