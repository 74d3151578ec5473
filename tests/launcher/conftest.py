"""Fixtures for the launcher tests: generated models (the default demo shape and one whose prefill
shows), a fake `vllm` on PATH. The llama-server binary and the supervisor factory come from tests/conftest.py."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "vllm_double.py"
sys.path.insert(0, str(DOUBLE.parent))  # the tests read the double's own constants (`from vllm_double import`)
# Prompt processing of this model takes tens of ms for ~800 tokens on one CPU core: hits vs misses show.
PREFILL_SHAPE = DemoModelShape(layers=4, embedding=256, heads=4, heads_kv=4, feed_forward=512, context=4096)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def prefill_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("models") / "prefill.gguf", PREFILL_SHAPE)


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `vllm` executable on PATH that runs the vLLM test double with this Python."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = 'vllm'\n"
                   f"runpy.run_path({str(DOUBLE)!r}, run_name='__main__')\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe
