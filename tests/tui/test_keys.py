"""Keys come from one table: the footer shows the keys of the tab on screen (Help and Quit always, at
any width), the help screen and the command palette list the same actions, replay leaves out the
live-only ones, and a tab's own key does nothing on another tab."""

from __future__ import annotations

import pytest
from fixtures import FixedFeed, sim_snapshot
from tui_helpers import wait_for

from gpudash.tui.actions import ACTIONS, BY_ID
from gpudash.tui.app import GpudashApp
from gpudash.tui.screens.dialogs import ChoiceScreen, HelpScreen
from gpudash.tui.widgets.keybar import KeyBar, keys_text
from gpudash.tui.widgets.overview import OverviewView
from gpudash.tui.widgets.servers import ServersView

pytestmark = pytest.mark.anyio


def app_for(replay: bool = False) -> GpudashApp:
    return GpudashApp(FixedFeed([sim_snapshot(tick=t) for t in range(3)]), replay=replay)


def footer(app: GpudashApp) -> str:
    return str(app.query_one(KeyBar).render())


async def loaded(pilot, app: GpudashApp) -> None:
    await wait_for(pilot, lambda: app.info is not None and app.state.ticks == 3, what="the fixed feed")


async def test_the_footer_shows_the_keys_of_the_active_tab() -> None:
    app = app_for()
    async with app.run_test(size=(160, 48)) as pilot:
        await loaded(pilot, app)
        assert " g  Next GPU" in footer(app) and " x  Stop" not in footer(app)
        await pilot.press("3")
        text = footer(app)
        assert all(f" {k}  {d}" in text for k, d in (("S", "Start"), ("x", "Stop"),
                                                       ("R", "Restart"), ("s", "Next server")))
        assert "Next GPU" not in text
        await pilot.press("6")
        assert " m  Shard size" in footer(app) and "Memory share" not in footer(app)
        await pilot.press("7")
        assert " e  Export session" in footer(app)


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
async def test_help_and_quit_stay_in_the_footer_on_every_tab(size: tuple[int, int]) -> None:
    app = app_for()
    async with app.run_test(size=size) as pilot:
        await loaded(pilot, app)
        for key in "12345678":
            await pilot.press(key)
            text = footer(app)
            assert len(text) == size[0], text
            assert text.rstrip().endswith(" ?  Help  q  Quit"), (key, text)
            if key == "3":  # the server keys come first on the Servers tab, so the narrowest footer has them
                assert " S  Start  x  Stop  R  Restart" in text, text


def test_keys_text_drops_items_from_the_end_and_never_the_pinned_ones() -> None:
    """Keys that do not fit give way from the end to a "more: ?" hint (the help lists every key)."""
    items = [("a", "one"), ("b", "two"), ("c", "three")]
    assert keys_text(items, [("?", "Help")], 40).plain == " a  one  b  two  c  three " + " " * 5 + " ?  Help "
    assert keys_text(items, [("?", "Help")], 30).plain == " a  one " + " more: ? " + " " * 4 + " ?  Help "
    assert keys_text(items, [("?", "Help")], 5).plain == " ?  Help "  # too narrow: the pinned one still shows


async def test_a_tab_key_does_nothing_on_another_tab() -> None:
    app = app_for()
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, app)
        await pilot.press("x")  # Stop server belongs to the Servers tab
        assert not isinstance(app.screen, ChoiceScreen)
        await pilot.press("3", "x")
        assert isinstance(app.screen, ChoiceScreen)


async def test_help_and_palette_list_the_table_and_replay_hides_live_keys() -> None:
    live = app_for()
    async with live.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, live)
        await pilot.press("question_mark")
        assert isinstance(live.screen, HelpScreen)
        ids = [r[1] for r in live.screen.rows]
        assert ids == [a.id for a in ACTIONS if a.mode != "replay"]
        assert dict((r[1], r[3]) for r in live.screen.rows)["server_stop"] == "servers"
        await pilot.press("escape", "3")
        titles = {c.title for c in live.get_system_commands(live.screen)}
        assert {"Stop", "Split ratios", "Engine knobs", "Quit"} <= titles and "Pause/play" not in titles
    replay = app_for(replay=True)
    async with replay.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: replay.info is not None, what="the replay feed")
        text = footer(replay)
        assert "Pause (playing at 1x)" in text and "Engine knobs" not in text and "Recording" not in text
        await pilot.press("space", "plus")
        assert "Play (paused at 2x)" in footer(replay)
        await pilot.press("k")
        assert replay.screen is replay.screen_stack[0]  # no knob form in a replay
        await pilot.press("question_mark")
        ids = {r[1] for r in replay.screen.rows}
        assert BY_ID["edit_knobs"].id not in ids and "replay_pause" in ids


async def test_g_and_s_move_a_selection_you_can_see() -> None:
    app = app_for()
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, app)
        await pilot.press("g")
        await pilot.pause(0.05)
        card = app.query_one("#gpu-1")
        assert app.query_one(OverviewView).selected_gpu == 1 and card.has_class("selected") and not app.query_one("#gpu-0").has_class("selected")
        assert any("reverse" in str(span.style) for span in card.lines[0].spans)  # the name shows in reverse
        await pilot.press("3", "s")
        title = str(app.query_one("#servers-title").content)
        assert app.query_one(ServersView).selected_server == "small" and "selected:  small " in title


def test_every_view_action_is_a_method_of_the_views_it_shows_on() -> None:
    """A key with a target runs action_<method> on the view on screen: every view it applies to has it,
    and the up/down keys apply to every view."""
    from gpudash.tui.actions import VIEWS

    for a in ACTIONS:
        if a.target is None:
            assert hasattr(GpudashApp, f"action_{a.method}"), a.id
            continue
        views = [v for v in VIEWS if issubclass(v.widget, a.target)]
        assert views, a.id
        assert all(callable(getattr(v.widget, f"action_{a.method}", None)) for v in views), a.id
    assert BY_ID["select_next"].views == () and BY_ID["server_stop"].views == ("servers",)
    assert BY_ID["edit_split"].views == ("split", "servers")


async def test_replay_names_its_keys_as_they_read() -> None:
    """A binding of two keys reads as both keys, never as Textual's names (plus,equals_sign)."""
    replay = app_for(replay=True)
    async with replay.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: replay.info is not None, what="the replay feed")
        assert replay.key_of(BY_ID["replay_faster"]) == "+ or ="
        assert " + or =  Faster" in footer(replay) and "equals_sign" not in footer(replay)
        await pilot.press("question_mark")
        assert {r[1]: r[0] for r in replay.screen.rows}["replay_faster"] == "+ or ="


async def test_help_scrolls_by_keyboard_to_every_key_at_80x24() -> None:
    app = app_for()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        await pilot.press("question_mark")
        table = app.screen.query_one("#help-keys")
        await pilot.press("end")
        assert table.cursor_row == table.row_count - 1 and table.scroll_offset.y > 0
        await pilot.press("k", "k")
        assert table.cursor_row == table.row_count - 3
        await pilot.press("home", "j", "pagedown")
        assert table.cursor_row > 1
