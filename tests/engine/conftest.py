"""Engines for the sim-backend tests; every engine a test makes is closed after it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gpudash.engine import EngineConfig, TransferEngine


@pytest.fixture
def make_engine() -> Iterator[Callable[..., TransferEngine]]:
    made: list[TransferEngine] = []

    def make(profile: str = "8xh20", **kw: object) -> TransferEngine:
        eng = TransferEngine(EngineConfig(backend="sim", profile=profile, **kw))  # type: ignore[arg-type]
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.close()


@pytest.fixture
def fast_engine(make_engine: Callable[..., TransferEngine]) -> TransferEngine:
    """8xh20 at time scale 1: links are faster than memcpy, so copies run at memcpy speed (integrity tests)."""
    return make_engine("8xh20", sim_time_scale=1.0)
