"""Split's `t` (issue 45, 13): on the Split tab it edits a split that exists, so a model on one GPU (the
CPU demo, `small`) gets a sentence, not a split form; and keys typed before a form opened (meant for the
dashboard while `t` was handled) never land in its text field."""

from __future__ import annotations

import pytest
from fixtures import SPECS, FixedFeed, sim_snapshot
from textual import events
from textual.widgets import Input
from tui_helpers import screen_lines, wait_for

from gpudash.tui.app import GpudashApp
from gpudash.tui.screens.forms import SplitForm

pytestmark = pytest.mark.anyio


async def test_t_on_split_offers_no_form_for_a_model_that_is_not_split() -> None:
    app = GpudashApp(FixedFeed([sim_snapshot(tick=0)], specs={"small": SPECS["small"]}))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 1 and app.info is not None, what="the fixed feed")
        await pilot.press("2")
        await pilot.pause(0.1)
        assert "Split ratios" not in screen_lines(app)[-1]  # the footer does not offer it
        await pilot.press("t")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, SplitForm)
        screen = "\n".join(screen_lines(app))
        assert "is not split across GPUs: nothing to edit here" in screen, screen


async def test_keys_typed_before_a_form_opened_stay_out_of_its_field() -> None:
    app = GpudashApp(FixedFeed([sim_snapshot(tick=0)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 1 and app.info is not None, what="the fixed feed")
        await pilot.press("2")
        await pilot.pause(0.1)
        early = [events.Key("x", "x"), events.Key("9", "9")]  # typed while `t` was still being handled
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, SplitForm), what="the split form")
        field = app.screen.query_one("#split-ratios", Input)
        before = field.value
        for key in early:
            app.post_message(key)
        await pilot.pause(0.1)
        assert field.value == before
        await pilot.press("1")
        assert field.value != before  # a key typed after it opened does land
