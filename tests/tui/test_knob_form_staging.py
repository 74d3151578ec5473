"""The knob form (k) with the staging thresholds: every editable knob fits on a 120x40 screen, and a
staging threshold typed there reaches the live engine as a recorded change."""

from __future__ import annotations

import pytest
from textual.widgets import Input, Static
from tui_helpers import wait_for

from gpudash.config import EngineSettings
from gpudash.tui.app import GpudashApp
from gpudash.tui.screens.forms import EDITABLE_KNOBS, KnobForm

SIZE = (120, 40)

pytestmark = pytest.mark.anyio


async def test_staging_threshold_edit_reaches_the_engine(live_feed) -> None:
    app = GpudashApp(live_feed)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None and app.state.latest is not None, what="live feed")
        await pilot.press("5", "k")
        form = app.screen
        assert isinstance(form, KnobForm)
        assert {"h2d_staging_bytes", "d2h_staging_bytes"} <= set(EDITABLE_KNOBS)
        await pilot.pause()
        for k in EDITABLE_KNOBS:  # the form opens with the engine's values, every field on screen
            inp = form.query_one(f"#knob-{k}", Input)
            # sizes read as 2.81MB or 4MiB, and mean exactly the engine's value
            assert getattr(EngineSettings.model_validate({k: inp.value}), k) == live_feed.engine.knobs()[k], k
            assert 0 <= inp.region.y and inp.region.bottom <= SIZE[1] and inp.region.height == 1, k
        errors = form.query_one("#form-errors", Static)
        assert errors.region.height >= 1 and errors.region.bottom <= SIZE[1]
        form.query_one("#knob-d2h_staging_bytes", Input).focus()
        await pilot.press("ctrl+a", "ctrl+k", *"3 GiBB")  # not a size: refused where it is typed
        await pilot.pause()
        assert "d2h_staging_bytes: expected a size like" in str(errors.content)
        await pilot.press("enter")
        assert app.screen is form
        await pilot.press("ctrl+a", "ctrl+k", *"8MiB", "enter")
        await wait_for(pilot, lambda: any(e.kind == "engine.knobs" and e.ok for e in app.state.events),
                       what="the engine.knobs event")
        assert live_feed.engine.knobs()["d2h_staging_bytes"] == 8 * 2**20
        ev = next(e for e in app.state.events if e.kind == "engine.knobs")
        assert ev.old == {"d2h_staging_bytes": 2 * 2**20} and ev.new == {"d2h_staging_bytes": 8 * 2**20}
        await wait_for(pilot, lambda: "d2h_staging_bytes=8MiB" in str(app.query_one("#knobs", Static).content),
                       what="the Engine view's new knob")
