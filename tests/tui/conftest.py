"""Shared pieces for the TUI tests: UTC clock (stable snapshot text), a tiny real GGUF model, a live
feed on the sim rig with real servers and a real SQLite file, and a wait helper for pilots."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Callable

import pytest

from gpudash.config import Config, ServerSpec
from gpudash.launcher.gguf_model import DemoModelShape, write_demo_model
from gpudash.tui.feeds import LiveFeed

os.environ["TZ"] = "UTC"
time.tzset()

TINY = DemoModelShape(layers=1, embedding=64, heads=2, heads_kv=2, feed_forward=128, context=512)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_demo_model(path, TINY)
    return path


def live_config(model: Path, db: Path, profile: str = "8xh20") -> Config:
    """A sim rig sampled at 4 Hz; llama-server `big` split over GPUs 0 and 1, `side` on GPU 1; no probe."""
    return Config.model_validate({
        "sampling": {"interval_s": 0.25},
        "store": {"path": str(db), "flush_interval_s": 0.2},
        "sim": {"profile": profile, "load": "off"},
        "probe": {"enabled": False},
        "servers": [ServerSpec(name="big", model=str(model), gpus=[0, 1], tensor_split=[1, 1], share=0.5,
                               ctx_size=512, health_timeout_s=30).model_dump(),
                    ServerSpec(name="side", model=str(model), gpus=[1], share=0.4, ctx_size=512,
                               health_timeout_s=30).model_dump()],
    })


@pytest.fixture
def live_feed(tiny_model: Path, tmp_path: Path):
    cfg = live_config(tiny_model, tmp_path / "gpudash.db")
    feed = LiveFeed(cfg, "sim:8xh20", tmp_path / "gpudash.db", record=True, log_dir=tmp_path / "logs")
    try:
        yield feed
    finally:
        feed.close()


async def wait_for(pilot, cond: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> None:
    """Let the app run until `cond()` is true (workers and the sampler run on their own threads)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await pilot.pause(0.05)
        await asyncio.sleep(0)


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio through anyio's pytest plugin (Textual runs on asyncio)."""
    return "asyncio"
