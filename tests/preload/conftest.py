"""The fake CUDA libraries and the door test program, built once per session (fakebuild.py), and a runner
for one scenario under libgpudash_preload.so (found beside the engine library)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import fakebuild

# Small knobs so that 1 MiB copies exercise every policy: pageable ones are staged, pinned ones go
# multipath over the fake's two GPUs, 4 KiB ones pass through.
KNOBS = ("h2d_chunk_bytes=65536,d2h_chunk_bytes=65536,h2d_fallback_bytes=262144,d2h_fallback_bytes=262144,"
         "h2d_staging_bytes=131072,d2h_staging_bytes=131072,staging_threads=2")


@dataclass(frozen=True)
class Build:
    preload: Path
    libdir: Path
    program: Path


@pytest.fixture(scope="session")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Build:
    preload = fakebuild.find_preload()
    if preload is None:
        pytest.fail(f"{fakebuild.PRELOAD} was not built; run `cmake -S . -B build/dev && cmake --build build/dev` "
                    f"or `pip install .`")
    d = fakebuild.build_fakes(tmp_path_factory.mktemp("fakecuda"))
    program = fakebuild.build_program(fakebuild.HERE / "preload_doors.c", d / "preload_doors")
    return Build(preload, d, program)


@pytest.fixture
def run_doors(fakes: Build) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs one scenario of the door program under the preload; `env` adds or (value None) removes."""

    def run(scenario: str, env: dict[str, str | None] | None = None,
            preload: bool = True) -> subprocess.CompletedProcess[str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith("GPUDASH_")}
        e.update(LD_LIBRARY_PATH=str(fakes.libdir), GPUDASH_PRELOAD_KNOBS=KNOBS, GPUDASH_PRELOAD_PUBLISH_MS="5",
                 GPUDASH_PRELOAD_NAME="test-server")
        if preload:
            e["LD_PRELOAD"] = str(fakes.preload)
        for k, v in (env or {}).items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        return subprocess.run([str(fakes.program), scenario], env=e, capture_output=True, text=True, timeout=120)

    return run
