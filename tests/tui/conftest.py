"""Fixtures for the TUI tests: UTC clock (stable snapshot text), a tiny real GGUF model, and a live feed
on the sim rig with real servers and a real SQLite file (helpers the tests import are in tui_helpers)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpudash.launcher.gguf_model import DemoModelShape, write_demo_model
from gpudash.tui.feeds import LiveFeed
from tui_helpers import live_config

os.environ["TZ"] = "UTC"
time.tzset()

TINY = DemoModelShape(layers=1, embedding=64, heads=2, heads_kv=2, feed_forward=128, context=512)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_demo_model(path, TINY)
    return path


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
