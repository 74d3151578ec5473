"""Shared fixtures for the pool tests: a small heap pool (no engine needed)."""

from __future__ import annotations

import pytest

from gpudash.engine.pools import MemoryPool


@pytest.fixture
def pool():
    p = MemoryPool(1 << 20, shards={"a": 256 << 10, "b": 256 << 10})
    yield p
    p.close()
