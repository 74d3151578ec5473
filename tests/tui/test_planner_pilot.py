"""Pilot test of the Split view with a real llama-server split 1,1 on a 16 GB + 24 GB sim rig: PyPI's
llama-server is a CPU build, which the view and the planner key must be honest about."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_helpers import live_config, wait_for
from textual.widgets import Static

from gpudash.tui.app import GpudashApp
from gpudash.runtime.feed import LiveFeed
from gpudash.tui.screens.dialogs import ChoiceScreen

pytestmark = pytest.mark.anyio


@pytest.fixture
def mixed_feed(tiny_model: Path, tmp_path: Path):
    db = tmp_path / "gpudash.db"
    feed = LiveFeed(live_config(tiny_model, db, profile="rtx5080+rtx3090"), "sim:rtx5080+rtx3090", db,
                    record=True, log_dir=tmp_path / "logs")
    try:
        yield feed
    finally:
        feed.close()


async def test_a_cpu_build_gets_no_plan_and_p_says_why(mixed_feed) -> None:
    """The real llama-server here is PyPI's CPU build: its -ts does nothing, so the Split view says so
    instead of a balance and a plan ("every GPU fills the same" with 0 B held was the old claim), and `p`
    proposes nothing. (The planner's -ts on a GPU build: test_changes.py; applying it: test_control.py.)"""
    app = GpudashApp(mixed_feed)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.latest is not None and app.state.runs_on_cpu("big"),
                       what="big's CPU-build warning")
        await pilot.press("2")
        await wait_for(pilot, lambda: "has no effect" in str(app.query_one("#split-advice", Static).content),
                       what="the Split view saying the split does nothing")
        advice = str(app.query_one("#split-advice", Static).content)
        assert "big: -ts 1,1 has no effect: its llama.cpp build runs on the CPU" in advice and "planner" not in advice
        await pilot.press("p")
        assert not isinstance(app.screen, ChoiceScreen) and app.changes.pending is None
        await pilot.press("q")
