"""Helpers the TUI tests import: the live rig's config and a wait for pilots. A module of its own name,
because several test folders have a conftest.py and `from conftest import` picks whichever came first."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

from gpudash.config import Config, ServerSpec


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


async def wait_for(pilot, cond: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> None:
    """Let the app run until `cond()` is true (workers and the sampler run on their own threads)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await pilot.pause(0.05)
        await asyncio.sleep(0)


def screen_lines(app) -> list[str]:
    """The text of the screen as drawn (the top screen, with what shows of those under it)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def open_export_form(pilot, app):
    """The History tab's export form for the feed's one recorded session (keys 7, then e)."""
    from textual.widgets import DataTable

    from gpudash.tui.screens.export import ExportForm

    await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
    await pilot.press("7")
    table = app.query_one("#history-view").query_one(DataTable)
    await wait_for(pilot, lambda: table.row_count == 1, what="the sessions list")
    await pilot.press("e")
    assert isinstance(app.screen, ExportForm)
    return app.screen
