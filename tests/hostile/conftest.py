"""Fixtures of the hostile suite: a misbehaving OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hostile_server import HostileServer


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    srv = HostileServer().start()
    yield srv
    srv.close()
