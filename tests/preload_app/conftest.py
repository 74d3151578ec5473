"""Fixtures for the preload's Python side: C programs built from the shared header alone (its layout,
a process's shared-memory side, and a stand-in preload library), with real shm segments in /dev/shm."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpudash.preload import shm as P
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from preload_helpers import ProcessSide, remove_blocks

DATA = Path(__file__).resolve().parent / "data"
HEADER_DIR = Path(__file__).resolve().parents[2] / "csrc" / "preload"


def _cc(tmp_path_factory: pytest.TempPathFactory, source: str, out: str, *flags: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler (cc, gcc or clang) on PATH; the preload tests build C programs from "
                    "csrc/preload/gpudash_preload_shm.h")
    target = tmp_path_factory.mktemp("preload_c") / out
    subprocess.run([cc, "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(HEADER_DIR), *flags, "-o", str(target),
                    str(DATA / source), "-lrt"], check=True)
    return target


@pytest.fixture(scope="session")
def layout_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cc(tmp_path_factory, "layout.c", "layout")


@pytest.fixture(scope="session")
def process_side_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cc(tmp_path_factory, "process_side.c", "process_side")


@pytest.fixture(scope="session")
def stub_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cc(tmp_path_factory, "stub_preload.c", P.PRELOAD_LIB_NAME, "-shared", "-fPIC")


@pytest.fixture
def stub_preload(stub_library: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in library as the one preload_library() finds."""
    monkeypatch.setenv(P.PRELOAD_LIB_ENV, str(stub_library))
    return stub_library


@pytest.fixture
def process_side(process_side_program: Path) -> Iterator[Callable[..., ProcessSide]]:
    """Factory of running process_side.c programs; each is ended and its blocks removed at teardown."""
    made: list[ProcessSide] = []

    def start(name: str = "") -> ProcessSide:
        p = ProcessSide(process_side_program, name)
        made.append(p)
        return p

    yield start
    for p in made:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()
        remove_blocks(p.pid)


@pytest.fixture(scope="session")
def prefill_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model with room for prompts of a few thousand tokens."""
    return write_demo_model(tmp_path_factory.mktemp("models") / "ctx4k.gguf", DemoModelShape(context=4096))


@pytest.fixture
def after_stop() -> Callable[[list[int]], None]:
    """A server stopped by SIGTERM never ran its exit handlers: its shared-memory blocks are removed here."""
    def remove(pids: list[int]) -> None:
        for pid in pids:
            remove_blocks(pid)
    return remove
