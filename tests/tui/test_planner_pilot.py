"""Pilot test of the split planner in the Split balance view: on a 16 GB + 24 GB sim rig with a real
llama-server split 1,1, the view shows the planner's -ts beside the current one, and `p` applies it
through Controller.apply after the re-launch confirmation."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_helpers import live_config, wait_for
from textual.widgets import Static

from gpudash.tui.app import GpudashApp
from gpudash.tui.feeds import LiveFeed
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


async def test_planned_split_is_shown_and_applied(mixed_feed) -> None:
    app = GpudashApp(mixed_feed)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.latest is not None and any(
            s.server == "big" and s.state == "ready" for s in app.state.latest.servers), what="big ready")
        pid = next(s.pid for s in app.state.latest.servers if s.server == "big")
        await pilot.press("2")
        await wait_for(pilot, lambda: "planner -ts 2,3" in str(app.query_one("#split-advice", Static).content),
                       what="the planner's 2:3 for 16 GB + 24 GB")
        advice = str(app.query_one("#split-advice", Static).content)
        assert "big: -ts 1,1 now" in advice and "follows free memory" in advice  # current, planned and why
        await pilot.press("p")
        assert isinstance(app.screen, ChoiceScreen)
        assert "Re-launch big with split -ts 2,3 on GPUs 0,1?" in str(app.screen.query_one("#confirm-title", Static).content)
        await pilot.press("a")
        await wait_for(pilot, lambda: any(e.kind == "server.split" and e.ok for e in app.state.events),
                       what="the server.split event")
        ev = next(e for e in app.state.events if e.kind == "server.split")
        assert (ev.old, ev.new, ev.actor) == ([1.0, 1.0], [2.0, 3.0], "keyboard")
        await wait_for(pilot, lambda: any(s.server == "big" and s.state == "ready" and s.pid != pid
                                          for s in app.state.latest.servers), what="big re-launched")
        assert mixed_feed.controller.specs()["big"].tensor_split == [2.0, 3.0]
        await wait_for(pilot, lambda: "(already applied)" in str(app.query_one("#split-advice", Static).content),
                       what="the view showing the plan as applied")
        await pilot.press("q")
