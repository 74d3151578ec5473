"""Fixtures for the TUI tests: UTC clock (stable snapshot text) and a live feed
on the sim rig with real servers and a real SQLite file (helpers the tests import are in tui_helpers)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpudash.runtime.feed import LiveFeed
from tui_helpers import live_config

os.environ["TZ"] = "UTC"
time.tzset()

@pytest.fixture
def live_feed(tiny_model: Path, tmp_path: Path):
    cfg = live_config(tiny_model, tmp_path / "gpudash.db")
    feed = LiveFeed(cfg, "sim:8xh20", tmp_path / "gpudash.db", record=True, log_dir=tmp_path / "logs")
    try:
        yield feed
    finally:
        feed.close()


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio through anyio's pytest plugin (Textual runs on asyncio)."""
    return "asyncio"
