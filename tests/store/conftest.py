"""Fixtures: a fresh store file per test and the default config."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.store import Store


@pytest.fixture()
def store(tmp_path: Path):
    s = Store.open(tmp_path / "g.db")
    yield s
    s.close()


@pytest.fixture()
def config() -> Config:
    return Config()
