"""Snapshot tests (pytest-textual-snapshot) of every view at 120x40, fed fixed sim-rig snapshots so the
output is stable. Update the stored SVGs with `pytest tests/tui/test_snapshots.py --snapshot-update`
after checking the change by eye."""

from __future__ import annotations

import pytest
from textual.widgets import Input
from tui_helpers import wait_for
from fixtures import SPECS, FixedFeed, sim_snapshot

from gpudash.config import ServerSpec
from gpudash.tui.actions import BY_ID, VIEWS
from gpudash.tui.app import GpudashApp

SIZE = (120, 40)
TICKS = 12


def app_for(profile: str = "8xh20") -> GpudashApp:
    return GpudashApp(FixedFeed([sim_snapshot(profile, tick=t, degrade=3) for t in range(TICKS)]))


async def loaded(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.state.ticks == TICKS and pilot.app.info is not None,
                   what="the fixed snapshots")
    await pilot.pause(0.1)


@pytest.mark.parametrize("key, view", [("1", "overview"), ("2", "split"), ("3", "servers"), ("4", "latency"),
                                       ("5", "engine"), ("6", "pools"), ("8", "events")])
def test_view(snap_compare, key: str, view: str) -> None:
    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press(key)
        await pilot.pause(0.1)
        assert pilot.app.active_view == view

    assert snap_compare(app_for(), terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("profile", ["h200", "rtx5080+rtx3090"])
def test_overview_few_gpus(snap_compare, profile: str) -> None:
    assert snap_compare(app_for(profile), terminal_size=SIZE, run_before=loaded)


def test_help_screen(snap_compare) -> None:
    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.1)

    assert snap_compare(app_for(), terminal_size=SIZE, run_before=run_before)


def test_split_view_with_plan_and_share_warnings(snap_compare) -> None:
    """16 GB + 24 GB sim rig; `big` (share 0.6, -ts 1,1 over both) and `side` (share 0.5 on GPU 1): GPU 1's
    shares add up to 1.1, so the header counts a warning and the Split balance view lists it beside the
    planner's -ts for big."""
    specs = {"big": SPECS["big"].model_copy(update={"tensor_split": [1.0, 1.0], "share": 0.6}),
             "side": ServerSpec(name="side", model="/models/side.gguf", gpus=[1], share=0.5, port=8083)}
    app = GpudashApp(FixedFeed([sim_snapshot("rtx5080+rtx3090", tick=t) for t in range(TICKS)], specs=specs))

    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press("2")
        await pilot.pause(0.1)
        assert [w.kind for w in pilot.app.state.warnings] == ["oversubscribed"]
        assert pilot.app.header.warnings == 1

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


ALL_VIEWS = [(BY_ID[f"view_{v.id}"].key, v.id) for v in VIEWS]  # keys 1-9, then 0


@pytest.mark.parametrize("key, view", ALL_VIEWS)
def test_every_view_at_80x24(snap_compare, key: str, view: str) -> None:
    """The smallest terminal an operator uses, every tab: the footer keeps Help and Quit (and says "more: ?"
    where the tab's keys do not fit), the header keeps the word "simulated", the 8-GPU cards keep their
    PCIe lines, titles and status lines fit, and a table names the columns it hides."""

    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press(key)
        await pilot.pause(0.1)
        assert pilot.app.active_view == view

    assert snap_compare(app_for(), terminal_size=(80, 24), run_before=run_before)


@pytest.mark.parametrize("key, view", [("1", "overview"), ("3", "servers"), ("5", "engine"), ("6", "pools")])
def test_view_at_200x60(snap_compare, key: str, view: str) -> None:
    """A large terminal: the cards grow their history plots, the Overview lists the processes under them,
    each pool's slab line sits above a shard table whose columns fit."""

    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press(key)
        await pilot.pause(0.1)
        assert pilot.app.active_view == view

    assert snap_compare(app_for(), terminal_size=(200, 60), run_before=run_before)


def test_help_at_80x24_scrolls_to_the_last_key(snap_compare) -> None:
    """Every key is reachable at 80x24: the help list scrolls by keyboard to its end (Quit is last)."""

    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press("question_mark", "end")
        await pilot.pause(0.1)

    assert snap_compare(app_for(), terminal_size=(80, 24), run_before=run_before)


def test_knob_form_at_80x24_shows_its_title_and_error(snap_compare) -> None:
    """A bad value in the last field of the knob form: Enter keeps the form, and its title, the bad field
    and the error are all in sight."""

    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press("k")
        pilot.app.screen.query(Input).last().focus()  # staging_threads, at the bottom of the form
        await pilot.press("ctrl+a", "ctrl+k", *"many", "enter")
        await pilot.pause(0.1)

    assert snap_compare(app_for(), terminal_size=(80, 24), run_before=run_before)


def test_relaunch_dialog_at_80x24(snap_compare) -> None:
    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press("3", "t", "ctrl+a", "ctrl+k", *"1,1", "enter")
        await pilot.pause(0.1)

    assert snap_compare(app_for(), terminal_size=(80, 24), run_before=run_before)
