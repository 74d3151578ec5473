"""Builds the fake libcudart.so.13 / libcuda.so.1 (tests/preload/fakes), programs linked against them and
the preload's object files, with the system C compiler; the preload tests and
benchmarks/bench_preload_passthrough.py share it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PRELOAD = "libgpudash_preload.so"


class BuildError(RuntimeError):
    pass


def _cc(*args: str | Path) -> None:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise BuildError("no C compiler found; install one or set CC")
    out = subprocess.run([cc, *map(str, args)], capture_output=True, text=True)
    if out.returncode:
        raise BuildError(out.stderr)


def build_fakes(dest: Path) -> Path:
    """libcuda.so.1 and libcudart.so.13 in `dest`; returns `dest`."""
    src = HERE / "fakes"
    _cc("-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1", "-o", dest / "libcuda.so.1",
        src / "fake_cuda.c", "-lpthread")
    _cc("-shared", "-fPIC", "-O2", "-fvisibility=hidden", f"-Wl,--version-script={src / 'fake_cudart.map'}",
        "-Wl,-soname,libcudart.so.13", "-o", dest / "libcudart.so.13", src / "fake_cudart.c", "-ldl")
    return dest


def build_program(source: Path, dest: Path) -> Path:
    """A program linked against the fakes in dest.parent (found there at run time too)."""
    d = dest.parent
    _cc("-O2", f"-I{REPO / 'csrc' / 'preload'}", "-o", dest, source, f"-L{d}", "-l:libcudart.so.13",
        "-l:libcuda.so.1", f"-Wl,-rpath,{d}", "-ldl", "-lrt", "-lpthread")
    return dest


def build_preload_objects(dest: Path) -> list[Path]:
    """One object file in dest for each csrc/preload/*.c, compiled as CMakeLists.txt compiles them."""
    out = []
    for source in sorted((REPO / "csrc" / "preload").glob("*.c")):
        obj = dest / f"{source.stem}.o"
        _cc("-c", "-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden", f"-I{REPO / 'csrc'}",
            f"-I{REPO / 'csrc' / 'preload'}", "-o", obj, source)
        out.append(obj)
    return out


def find_preload() -> Path | None:
    """The newest libgpudash_preload.so beside any place the engine library may be (engine._native)."""
    from gpudash.engine import _native

    found = [c.parent / PRELOAD for c in _native._candidates() if (c.parent / PRELOAD).is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None
