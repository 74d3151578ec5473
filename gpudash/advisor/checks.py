"""Doctor checks: small pure functions from `DoctorFacts` to a verdict with its evidence and its fix.

Each check answers one question operators otherwise settle by hand with lspci, `nvidia-smi topo` and
BIOS menus. `skip` means the facts needed were not available (said in the evidence), never a pass. A
title names what is checked, never the outcome hoped for: "WARN  Resizable BAR on" read as the opposite
of the warning it was.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpudash.engine.profiles import pcie_payload_gbps
from gpudash.advisor.facts import DoctorFacts
from gpudash.launcher.llama.build_info import LlamaBuild
from gpudash.config import ServerSpec
from gpudash.launcher.probe import cache_kinds
from gpudash.launcher.kinds import ServerKind, kind_of
from gpudash.launcher.kinds.vllm import EAGER_SHARE_THRESHOLD
from gpudash.telemetry.topology import GpuFacts, TopologyFacts
from gpudash.launcher.shares import server_gpus, share_and_origin, shares_per_gpu

Status = Literal["pass", "warn", "fail", "skip"]

# BAR1 below this fraction of VRAM means resizable BAR is off (typically a 256 MiB window).
REBAR_MIN_FRACTION = 0.5
# GPUs copying across NUMA nodes beyond which the inter-socket link (UPI) capped the MMA paper's bandwidth.
UPI_GPU_CEILING = 6

P2P_MEANING = {"OK": "peer copies work", "NS": "not supported", "GNS": "GPU not supported",
               "CNS": "chipset not supported", "TNS": "topology not supported", "U": "unknown"}


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's verdict. `fix` is empty when there is nothing to do."""

    check: str
    title: str
    status: Status
    evidence: tuple[str, ...]  # one fact per line
    fix: str = ""


def _result(check: str, title: str, status: Status, evidence: str | list[str], fix: str = "") -> CheckResult:
    lines = evidence.splitlines() if isinstance(evidence, str) else [ln for e in evidence for ln in e.splitlines()]
    return CheckResult(check, title, status, tuple(lines), fix)


def _gpu_label(g: GpuFacts) -> str:
    return f"GPU {g.index} ({g.name})"


def _link(gen: int | None, width: int | None) -> str:
    return f"gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def check_link_under_load(f: DoctorFacts) -> CheckResult:
    """A PCIe link below its max generation or width while the engine is copying over it."""
    title = "PCIe link speed and width while busy"
    if f.busy is None:
        return _result("link_busy", title, "skip", f"links not tested under load: {f.busy_note}")
    rates = {b.gpu: b for b in f.busy}
    lines, low, unknown, slot_bound = [], [], [], []
    for g in f.topology.gpus:
        b = rates.get(g.index)
        moved = f", moving {b.gbps:.1f} GB/s" if b else ""
        if None in (g.link_gen, g.link_width, g.link_gen_max, g.link_width_max):
            unknown.append(g.index)
            lines.append(f"{_gpu_label(g)}: link state not reported{moved}")
            continue
        top = f"{_link(g.link_gen_max, g.link_width_max)} max, {pcie_payload_gbps(g.link_gen_max, g.link_width_max):.1f} GB/s"
        lines.append(f"{_gpu_label(g)}: {_link(g.link_gen, g.link_width)} while copying{moved} ({top})")
        if g.link_degraded:
            low.append(g.index)
        elif _slot_bound(g):
            slot_bound.append(g.index)
            rate = ("" if g.card_gen is None or g.card_width is None  # one of them may be unknown
                    else f" ({pcie_payload_gbps(g.card_gen, g.card_width):.1f} GB/s)")
            lines.append(f"{_gpu_label(g)}: the card is {_link(g.card_gen, g.card_width)}{rate}; its slot allows "
                         f"{_link(g.link_gen_max, g.link_width_max)} at most")
    if low:
        return _result("link_busy", title, "fail", lines,
                       f"GPU {', '.join(map(str, low))} trained below max under load: reseat the card or riser, "
                       "set the slot to its full generation in the BIOS (lock slots to Gen 4/5 instead of Auto), "
                       "then confirm with `sudo lspci -vvv | grep LnkSta`")
    if slot_bound:
        return _result("link_busy", title, "warn", lines,
                       f"the slot holds GPU {', '.join(map(str, slot_bound))} below what the card supports: move the "
                       "card to a slot wired for its full width and generation (the board manual says which slots "
                       "share lanes with M.2 drives or a second card), or accept the slower copies")
    if unknown and len(unknown) == len(f.topology.gpus):
        return _result("link_busy", title, "skip", lines)
    return _result("link_busy", title, "pass", lines)


def _slot_bound(g: GpuFacts) -> bool:
    """True when the link's max (the lower of card and slot) is below what the card itself supports."""
    return any(card is not None and top is not None and top < card
               for top, card in ((g.link_gen_max, g.card_gen), (g.link_width_max, g.card_width)))


def _needs_real_gpus(f: DoctorFacts, check: str, title: str, evidence: list[str] | None = None) -> CheckResult | None:
    """A skip for a check about real GPUs (builds, NCCL) on a simulated rig, whose servers run on the CPU."""
    if not f.topology.is_sim:
        return None
    return _result(check, title, "skip",
                   [f"simulated rig ({f.topology.source}): its GPUs are modelled and the servers run on the CPU, "
                    "so there is no GPU to check this against; run `gpudash doctor` on the GPU box", *(evidence or [])])


def check_resizable_bar(f: DoctorFacts) -> CheckResult:
    """Resizable BAR off: BAR1 (the CPU's window into VRAM) much smaller than VRAM."""
    title = "Resizable BAR (the CPU's window into all of VRAM)"
    small, lines = [], []
    for g in f.topology.gpus:
        if g.bar1_total is None or not g.memory_total:
            lines.append(f"{_gpu_label(g)}: BAR1 not reported")
            continue
        lines.append(f"{_gpu_label(g)}: BAR1 {g.bar1_total / 2**30:.2f} GiB for {g.memory_total / 2**30:.0f} GiB VRAM")
        if g.bar1_total < REBAR_MIN_FRACTION * g.memory_total:
            small.append(g.index)
    if small:
        return _result("rebar", title, "warn", lines,
                       "enable Above 4G Decoding and Re-Size BAR in the BIOS (with CSM disabled, UEFI boot) so "
                       f"GPU {', '.join(map(str, small))} map all VRAM")
    if all("not reported" in ln for ln in lines):
        return _result("rebar", title, "skip", lines)
    return _result("rebar", title, "pass", lines)


def p2p_table(topo: TopologyFacts) -> str:
    """The P2P matrix laid out like `nvidia-smi topo -p2p r`."""
    n = len(topo.gpus)
    head = "      " + "".join(f"{'GPU' + str(i):<6}" for i in range(n))
    rows = [f"{'GPU' + str(a):<6}" + "".join(f"{topo.p2p[a][b]:<6}" for b in range(n)) for a in range(n)]
    return "\n".join([head, *rows])


def check_p2p(f: DoctorFacts) -> CheckResult:
    """Which GPU pairs can copy peer to peer, and what that means for relays and NCCL."""
    topo = f.topology
    title = "GPU peer-to-peer (P2P) reads"
    if len(topo.gpus) < 2:
        return _result("p2p", title, "pass", "one GPU: no peer traffic")
    table = p2p_table(topo)
    bad = [(a, b, topo.p2p[a][b]) for a, b in itertools.combinations(range(len(topo.gpus)), 2)
           if topo.p2p[a][b] != "OK" or topo.p2p[b][a] != "OK"]
    link = "NVLink" if topo.nvlink else "PCIe"
    if not bad:
        return _result("p2p", title, "pass",
                       f"{table}\nevery pair copies peer to peer over {link}: the engine can relay host "
                       "copies through peer GPUs and NCCL uses P2P")
    pairs = ", ".join(f"{a}-{b} {code} ({P2P_MEANING.get(code, code)})" for a, b, code in bad)
    return _result(
        "p2p", title, "warn",
        f"{table}\nno P2P for {pairs}: the engine uses only each GPU's direct link for these pairs (no relays), "
        "and NCCL stages their traffic through host memory, two PCIe crossings per transfer",
        "expected for mixed-generation consumer cards; prefer llama.cpp layer/tensor split with "
        "-DGGML_CUDA_NCCL=OFF over NCCL all-reduce, and keep -ts balanced so little crosses the host")


def check_numa_affinity(f: DoctorFacts) -> CheckResult:
    """GPUs on a NUMA node other than the CPUs gpudash's engine threads run on."""
    title = "NUMA node of the GPUs and the engine threads"
    cpu = f.cpu
    if f.topology.numa_nodes == 1:
        return _result("numa_affinity", title, "pass", "one NUMA node: every GPU is local to every CPU")
    if cpu.nodes is None:
        return _result("numa_affinity", title, "skip", f"NUMA nodes of the CPUs unknown ({cpu.note})")
    known = [g for g in f.topology.gpus if g.numa_node is not None and g.numa_node >= 0]
    if not known:
        return _result("numa_affinity", title, "skip", "no GPU reports its NUMA node")
    far = [g for g in known if g.numa_node not in cpu.nodes]
    nodes = ",".join(map(str, sorted(cpu.nodes)))
    evidence = [f"engine threads may run on CPUs of node(s) {nodes}{' (' + cpu.note + ')' if cpu.note else ''}",
                ", ".join(f"GPU {g.index} on node {g.numa_node}" for g in known)]
    if far:
        return _result("numa_affinity", title, "warn", evidence,
                       f"GPU {', '.join(str(g.index) for g in far)} sit on another node: run gpudash under "
                       f"`numactl --cpunodebind={far[0].numa_node} --membind={far[0].numa_node}` (or widen its "
                       "CPU affinity) so staging copies stay node-local")
    return _result("numa_affinity", title, "pass", evidence)


def check_numa_ceiling(f: DoctorFacts) -> CheckResult:
    """More than six GPUs copying across NUMA nodes: the inter-socket link becomes the ceiling."""
    title = f"GPUs copying across NUMA nodes (up to {UPI_GPU_CEILING} keep full speed)"
    if f.topology.numa_nodes == 1:
        return _result("numa_ceiling", title, "pass", "one NUMA node: no copy crosses an inter-socket link")
    gpus = [g for g in f.topology.gpus if g.numa_node is not None and g.numa_node >= 0]
    if f.cpu.nodes is None or not gpus:
        return _result("numa_ceiling", title, "skip", "NUMA placement of CPUs or GPUs unknown")
    gpu_nodes = {g.numa_node for g in gpus}
    if len(f.cpu.nodes) == 1:
        crossing = [g for g in gpus if g.numa_node not in f.cpu.nodes]
        how = f"host buffers on node {next(iter(f.cpu.nodes))}"
    else:  # unpinned threads: buffers land on whichever node touched them first
        crossing = gpus if len(gpu_nodes | f.cpu.nodes) > 1 else []
        how = f"threads unpinned across nodes {','.join(map(str, sorted(f.cpu.nodes)))}"
    evidence = (f"{len(crossing)} of {len(f.topology.gpus)} GPUs may copy across NUMA nodes ({how}, GPUs on "
                f"node(s) {','.join(map(str, sorted(gpu_nodes)))})")
    if len(crossing) > UPI_GPU_CEILING:
        return _result("numa_ceiling", title, "warn",
                       [evidence, f"beyond {UPI_GPU_CEILING} such GPUs the inter-socket link (UPI) caps "
                                  "aggregate host<->GPU bandwidth, as the MMA paper measured"],
                       "keep each GPU's pinned host buffers on its own node (one gpudash/engine per node "
                       "under numactl, or node-local pools), or run at most six GPUs' copies at once")
    return _result("numa_ceiling", title, "pass", evidence)


def _server_gpus(s: ServerSpec, topo: TopologyFacts) -> list[int]:
    return server_gpus(s, (g.index for g in topo.gpus))


def check_shares(f: DoctorFacts) -> CheckResult:
    """Memory shares of the servers on one GPU adding up to more than the whole GPU."""
    title = "Memory shares per GPU (their sum, up to 1)"
    per_gpu = shares_per_gpu(f.servers, (g.index for g in f.topology.gpus))
    if not per_gpu:
        return _result("shares", title, "pass", "no server declares a memory share")
    totals = {i: sum(share for _, share in held) for i, held in per_gpu.items()}
    evidence = [f"GPU {i}: " + " + ".join(f"{s.name} {share:g} ({share_and_origin(s)[1]})" for s, share in per_gpu[i])
                + f" = {totals[i]:.2f}" for i in sorted(per_gpu)]
    over = [i for i in sorted(totals) if totals[i] > 1.0 + 1e-9]
    if over:
        return _result("shares", title, "fail", evidence,
                       f"lower `share` (or gpu_memory_utilization) of the servers on GPU {', '.join(map(str, over))} "
                       "so they add up to 1 or less; the last server to start would fail to allocate")
    return _result("shares", title, "pass", evidence)


def _kind(spec: ServerSpec) -> ServerKind | None:
    """The server's kind, None for an attached server that has not said it yet."""
    return kind_of(spec) if spec.kind is not None else None


def check_enforce_eager(f: DoctorFacts) -> CheckResult:
    """Three or more vLLM servers on one GPU while one of them keeps CUDA graphs (no --enforce-eager)."""
    title = f"vLLM --enforce-eager where {EAGER_SHARE_THRESHOLD} or more servers share a GPU"
    per_gpu: dict[int, list[tuple[ServerSpec, bool | None]]] = {}  # (server, its eager switch)
    for s in f.servers:
        if (kind := _kind(s)) is not None and kind.eager_field:
            for i in _server_gpus(s, f.topology):
                per_gpu.setdefault(i, []).append((s, getattr(s, kind.eager_field)))
    crowded = {i: ss for i, ss in per_gpu.items() if len(ss) >= EAGER_SHARE_THRESHOLD}
    if not crowded:
        most = max((len(ss) for ss in per_gpu.values()), default=0)
        return _result("enforce_eager", title, "pass", f"at most {most} vLLM server(s) on any GPU")
    bad = sorted({s.name for ss in crowded.values() for s, eager in ss if eager is False})
    evidence = [
        f"GPU {i}: " + ", ".join(f"{s.name} (enforce_eager={'unset, launcher adds it' if eager is None else eager})"
                                 for s, eager in ss) for i, ss in sorted(crowded.items())]
    if bad:
        return _result("enforce_eager", title, "fail", evidence,
                       f"set enforce_eager = true (or remove enforce_eager = false) for {', '.join(bad)}: each "
                       "server's CUDA graphs reserve memory, and several of them on one card run out of it")
    return _result("enforce_eager", title, "pass", evidence)


def _cc_num(cc: tuple[int, int]) -> int:
    return cc[0] * 10 + cc[1]


def check_llama_archs(f: DoctorFacts) -> CheckResult:
    """A llama.cpp binary built without the compute capabilities of the GPUs present."""
    title = "llama.cpp archs against these GPUs' compute capabilities"
    b = f.llama
    if (sim := _needs_real_gpus(f, "llama_archs", title)) is not None:
        return sim
    if b is None:
        return _result("llama_archs", title, "skip", f"no llama-server to inspect: {f.llama_note}")
    gpus = [g for g in f.topology.gpus if g.compute_capability is not None]
    where = [f"binary: {b.binary}", f"version: {b.version or 'unknown'}", f"read from: {b.evidence}"]
    if not gpus:
        return _result("llama_archs", title, "skip", ["no GPU reports its compute capability", *where])
    ccs = ", ".join(f"GPU {g.index} CC {g.compute_capability[0]}.{g.compute_capability[1]}" for g in gpus)
    want = ";".join(sorted({str(_cc_num(g.compute_capability)) for g in gpus}, key=int))
    rebuild = (f"`gpudash llama build` compiles one for these GPUs into the user cache; for your own build use "
               f"-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=\"{want}\" -DGGML_NATIVE=OFF")
    if b.sass_archs is None or b.ptx_archs is None:
        return _result("llama_archs", title, "warn", ["CUDA build whose architectures could not be read", ccs, *where],
                       "check the server log's 'CUDA : ARCHS =' line against the GPUs' compute capabilities")
    if not b.sass_archs and not b.ptx_archs:
        return _result("llama_archs", title, "fail",
                       [f"built without CUDA (backend {b.backend or 'unknown'}): it cannot use {ccs}", *where], rebuild)
    missing, jit = [], []
    for g in gpus:
        major, minor = g.compute_capability
        sass_ok = any(a // 10 == major and a % 10 <= minor for a in b.sass_archs)
        ptx_ok = any(a <= _cc_num(g.compute_capability) for a in b.ptx_archs)
        if not sass_ok:
            (jit if ptx_ok else missing).append(g)
    evidence = [ccs, f"built for sm {','.join(map(str, b.sass_archs)) or 'none'}"
                     f" + PTX {','.join(map(str, b.ptx_archs)) or 'none'}", *where]
    if missing:
        return _result("llama_archs", title, "fail",
                       [f"no code for GPU {', '.join(str(g.index) for g in missing)}", *evidence], rebuild)
    if jit:
        return _result("llama_archs", title, "warn",
                       [f"GPU {', '.join(str(g.index) for g in jit)} only via PTX JIT (slow first start, "
                            "older instructions)", *evidence], rebuild)
    return _result("llama_archs", title, "pass", evidence)


def _build_words(b: LlamaBuild) -> str:
    if b.backend != "cuda":
        return f"{(b.backend or 'unknown').upper()} build"
    archs = ",".join(map(str, b.sass_archs or ())) or "unknown archs"
    return f"CUDA build for sm {archs}"


def check_llama_builds(f: DoctorFacts) -> CheckResult:
    """Which llama-server each server runs, and whether it can use this box's GPUs."""
    title = "llama-server build per server"
    if not f.llama_servers:
        return _result("llama_builds", title, "skip", "no llama.cpp server is configured")
    evidence = [f"{s.server}: {_build_words(s.build)}, {s.build.binary} ({s.origin})" if s.build
                else f"{s.server}: no llama-server ({s.origin})" for s in f.llama_servers]
    if (sim := _needs_real_gpus(f, "llama_builds", title, evidence)) is not None:
        return sim
    real_gpus = [g for g in f.topology.gpus if g.compute_capability is not None]
    if not real_gpus:
        return _result("llama_builds", title, "pass", [*evidence, "no GPU reports its compute capability"])
    cpu_only = [s.server for s in f.llama_servers if s.build is None or s.build.backend != "cuda"]
    if cpu_only:
        want = ",".join(sorted({str(_cc_num(g.compute_capability)) for g in real_gpus}, key=int))
        return _result("llama_builds", title, "warn",
                       [f"{', '.join(cpu_only)} cannot offload to the GPUs (-ngl does nothing without CUDA)", *evidence],
                       f"`gpudash llama build` compiles a CUDA llama-server for sm {want} into the user cache "
                       "(about 5 minutes on 16 cores); gpudash runs it from then on")
    return _result("llama_builds", title, "pass", evidence)


def _consumer(g: GpuFacts) -> bool:
    """GeForce cards: no P2P across generations, and NCCL tuned for links they lack."""
    return "GeForce" in g.name


def check_nccl_mixed(f: DoctorFacts) -> CheckResult:
    """NCCL in use for a pair of mixed-generation consumer cards that cannot do P2P."""
    title = "NCCL across mixed-generation consumer cards without P2P"
    if (sim := _needs_real_gpus(f, "nccl_mixed", title)) is not None:
        return sim
    topo = f.topology
    pairs = [(a, b) for a, b in itertools.combinations(topo.gpus, 2)
             if _consumer(a) and _consumer(b) and a.compute_capability and b.compute_capability
             and a.compute_capability[0] != b.compute_capability[0] and topo.p2p[a.index][b.index] != "OK"]
    if not pairs:
        return _result("nccl_mixed", title, "pass", "no pair of mixed-generation consumer GPUs without P2P")
    pair_text = ", ".join(f"GPU {a.index}+{b.index} ({a.name.replace('NVIDIA ', '')} + {b.name.replace('NVIDIA ', '')}, "
                          f"P2P {topo.p2p[a.index][b.index]})" for a, b in pairs)
    users = []
    if f.llama is not None and f.llama.nccl:
        users.append(f"llama-server {f.llama.binary} links NCCL")
    idx = {i for a, b in pairs for i in (a.index, b.index)}
    for s in f.servers:
        ranks = kind.nccl_ranks(s) if (kind := _kind(s)) is not None else 1
        if ranks > 1 and len(idx & set(_server_gpus(s, topo))) > 1:
            users.append(f"{kind.label} server {s.name} runs tensor parallel {ranks} over NCCL")
    if users:
        return _result("nccl_mixed", title, "warn", [pair_text, *users],
                       "build llama.cpp with -DGGML_CUDA_NCCL=OFF (on such pairs NCCL's sync cost outweighs it: "
                       "60 -> 80+ tok/s reported) and split with -sm/-ts instead of NCCL tensor parallelism")
    if f.llama is None or f.llama.nccl is None:
        return _result("nccl_mixed", title, "skip",
                       [pair_text, f"whether llama-server uses NCCL is unknown ({f.llama_note or 'not readable'})"])
    return _result("nccl_mixed", title, "pass", [pair_text, "nothing configured uses NCCL on them"])


def check_prompt_cache_restore(f: DoctorFacts) -> CheckResult:
    """A prompt restored from llama-server's host-memory cache (--cache-ram) taking longer to its first
    token than computing a prompt anew, judged from the recorded probe requests of each server."""
    title = "Host-cache prompt restores against recomputing"
    if not f.requests:
        return _result("prompt_cache", title, "skip", f.requests_note or "no probe requests recorded yet")
    servers = cache_kinds.by_server(f.requests, f.cache_restores)
    lines = [f"{c.server}: {cache_kinds.summary_text(c.stats)}" for c in servers]
    slow = [c for c in servers if c.restores_lose]
    if slow:
        worst = ", ".join(f"{c.server} ({c.versus_text()})" for c in slow)
        return _result("prompt_cache", title, "warn", lines,
                       f"restoring a prompt from host memory is slower than recomputing it on this box for {worst}: "
                       + cache_kinds.SLOW_RESTORE_FIX)
    if not any(c.compared for c in servers):
        n = cache_kinds.MIN_PER_KIND
        return _result("prompt_cache", title, "skip",
                       [*lines, f"no server has {n} recorded host-cache restores and {n} misses "
                                "to compare yet (llama-server builds that log restores at trace verbosity need "
                                '"-lv", "4" in extra_args)'])
    return _result("prompt_cache", title, "pass", lines)


CHECKS: tuple[Callable[[DoctorFacts], CheckResult], ...] = (
    check_link_under_load, check_resizable_bar, check_p2p, check_numa_affinity, check_numa_ceiling,
    check_shares, check_enforce_eager, check_llama_builds, check_llama_archs, check_nccl_mixed,
    check_prompt_cache_restore,
)


def run_checks(facts: DoctorFacts) -> list[CheckResult]:
    """Every check over the same facts, in a stable order."""
    return [check(facts) for check in CHECKS]


def exit_code(results: list[CheckResult]) -> int:
    """0 when no check failed, else 1: a skip (facts missing, or a simulated rig) is never a failure."""
    return 1 if any(r.status == "fail" for r in results) else 0
