"""What a call that libgpudash_preload.so passes through costs, per door (target: at most 0.5 us).

Builds the fake CUDA libraries (tests/preload/fakes) with copies that do nothing, runs
bench_preload_passthrough.c without and with LD_PRELOAD, and prints ns per call side by side.

    python benchmarks/bench_preload_passthrough.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "preload")]

import fakebuild  # noqa: E402


def _run(program: Path, libdir: Path, preload: Path | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDASH_")}
    env.update(LD_LIBRARY_PATH=str(libdir), FAKECUDA_NULL_COPIES="1")
    if preload:
        env["LD_PRELOAD"] = str(preload)
    out = subprocess.run([str(program)], env=env, capture_output=True, text=True, check=True)
    return {name: float(ns) for name, ns in (line.split("\t") for line in out.stdout.splitlines())}


def main() -> int:
    preload = fakebuild.find_preload()
    if preload is None:
        print(f"{fakebuild.PRELOAD} was not built; run `cmake -S . -B build/dev && cmake --build build/dev`",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        d = fakebuild.build_fakes(Path(tmp))
        program = fakebuild.build_program(REPO / "benchmarks" / "bench_preload_passthrough.c", d / "bench")
        native = _run(program, d, None)
        under = _run(program, d, preload)
    print(f"pass-through cost per call (fake CUDA, null copies; {preload})")
    print(f"{'door':44} {'native ns':>10} {'preload ns':>11} {'extra ns':>9} {'ratio':>6}")
    for name, ns in native.items():
        p = under[name]
        print(f"{name:44} {ns:10.1f} {p:11.1f} {p - ns:9.1f} {p / ns:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
