"""One knob in one unit on both screens (issue 45, 12): the Engine tab's knob line spells each value as the
knob form and the config file do (2.81MB, 16MiB), so no value reads 2.68 MiB on one screen and 2.81 MB on
the other, and no value is broken across two lines at 80x24."""

from __future__ import annotations

import pytest
from fixtures import FixedFeed, sim_snapshot
from textual.widgets import Input
from tui_helpers import screen_lines, wait_for

from gpudash.tui.app import GpudashApp

pytestmark = pytest.mark.anyio


async def test_engine_tab_and_knob_form_agree_and_no_value_wraps_at_80x24() -> None:
    feed = FixedFeed([sim_snapshot(tick=0)])
    app = GpudashApp(feed)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
        await pilot.press("5")
        await pilot.pause(0.1)
        engine = screen_lines(app)
        await pilot.press("k")
        await wait_for(pilot, lambda: app.screen.id == "knob-form", what="the knob form")
        form = {i.id.removeprefix("knob-"): i.value for i in app.screen.query(Input)}
        assert form["h2d_chunk_bytes"] == "2.81MB"
        for knob, value in form.items():
            assert any(f"{knob}={value}" in line for line in engine), (knob, value, engine)
