"""The CUDA engine the GPU tests share, one per test module (run on a GPU machine: pytest -m gpu tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpudash.engine import EngineConfig, TransferEngine


@pytest.fixture(scope="module")
def eng() -> Iterator[TransferEngine]:
    e = TransferEngine(EngineConfig(backend="cuda"))
    yield e
    e.close()
