"""Pending changes and the confirmation dialog, driven by keys: a change that re-launches a server is
confirmed in words that fit it, waits as one visible pending change when put off, is replaced only
after asking, and every discard reaches the controller's inbox as an event (the store's path)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fixtures import SPECS, FixedFeed, sim_snapshot
from textual.widgets import Input, Static
from tui_helpers import wait_for

from gpudash.config import ServerSpec
from gpudash.runtime.control import Controller, ServerAction, SetShare, SetSplit
from gpudash.telemetry.inbox import Inbox
from gpudash.tui.app import GpudashApp
from gpudash.tui.screens.dialogs import ChoiceScreen
from gpudash.tui.screens.forms import KnobForm, ShareForm, SplitForm
from gpudash.tui.widgets.keybar import KeyBar

pytestmark = pytest.mark.anyio
SIZE = (120, 40)


def make_app(specs: dict | None = None, profile: str = "8xh20") -> tuple[GpudashApp, Inbox]:
    inbox = Inbox()
    controller = Controller(inbox=inbox)  # a real controller without servers: changes are refused, discards recorded
    snaps = [sim_snapshot(profile, tick=t) for t in range(3)]
    if specs is not None:  # the servers in the samples are the given ones
        snaps = [replace(s, servers=tuple(replace(s.servers[0], server=name) for name in specs)) for s in snaps]
    feed = FixedFeed(snaps, specs=specs, controller=controller)
    controller.specs = lambda: dict(feed.specs)  # type: ignore[method-assign]  # the feed's servers, as a supervisor's
    return GpudashApp(feed), inbox


def discarded(inbox: Inbox) -> list[tuple[str, str, str]]:
    """(kind, target, reason) of the discard events the inbox holds so far (drains it)."""
    events = inbox.poll().get("events", ())
    return [(e.kind, e.target, e.reason) for e in events if e.kind.endswith(".discarded")]


def footer(app: GpudashApp) -> str:
    return str(app.query_one(KeyBar).render())


def dialog_text(app: GpudashApp) -> str:
    return " ".join(str(app.screen.query_one(s, Static).content) for s in ("#confirm-title", "#confirm-text",
                                                                               "#confirm-keys"))


async def loaded(pilot, app: GpudashApp) -> None:
    await wait_for(pilot, lambda: app.info is not None and app.state.ticks == 3, what="the fixed feed")


async def test_stop_dialog_says_stop_and_cancel_discards_with_an_event() -> None:
    app, inbox = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "x")
        assert isinstance(app.screen, ChoiceScreen)
        text = dialog_text(app)
        assert "Stop big?" in text and "stays stopped" in text and "re-launch" not in text
        assert " a  apply now" in text  # the same key the footer names for apply
        await pilot.press("escape")
        assert not isinstance(app.screen, ChoiceScreen) and app.changes.pending is None
        assert "pending" not in footer(app)
        await wait_for(pilot, lambda: (found := discarded(inbox)) and found[0][:2] == ("server.stop.request.discarded",
                                                                                         "big"),
                       what="the discard event")


async def test_later_keeps_one_pending_change_that_esc_discards() -> None:
    app, inbox = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "R", "l")
        assert app.changes.pending == ServerAction("big", "restart")
        assert "pending: restart big" in footer(app) and " a  apply" in footer(app) and "discard" in footer(app)
        await pilot.press("escape")
        assert app.changes.pending is None
        assert discarded(inbox) == [("server.restart.request.discarded", "big", "discarded with Esc")]


async def test_a_knob_change_leaves_the_pending_restart_alone() -> None:
    app, inbox = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "R", "l", "k")
        assert isinstance(app.screen, KnobForm)
        await pilot.press("ctrl+a", "ctrl+k", *"4MiB", "enter")  # applies at once (refused here: no engine)
        await wait_for(pilot, lambda: not isinstance(app.screen, KnobForm), what="the knob form closing")
        assert app.changes.pending == ServerAction("big", "restart")
        assert "pending: restart big" in footer(app)
        assert discarded(inbox) == []


async def test_a_second_relaunch_replaces_the_pending_one_only_after_asking() -> None:
    app, inbox = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "t")
        assert isinstance(app.screen, SplitForm)
        await pilot.press("ctrl+a", "ctrl+k", *"1,1", "enter", "l")
        assert app.changes.pending == SetSplit("big", (1.0, 1.0))
        await pilot.press("m")
        assert isinstance(app.screen, ShareForm)
        await pilot.press("ctrl+a", "ctrl+k", *"0.5", "enter")
        assert isinstance(app.screen, ChoiceScreen) and "Replace the pending change?" in dialog_text(app)
        await pilot.press("escape")  # keep the split; the share is dropped, and that is recorded
        assert app.changes.pending == SetSplit("big", (1.0, 1.0))
        assert [d[0] for d in discarded(inbox)] == ["server.share.discarded"]
        await pilot.press("m", "ctrl+a", "ctrl+k", *"0.5", "enter", "a")  # now replace it
        assert isinstance(app.screen, ChoiceScreen) and "memory share 0.5" in dialog_text(app)
        assert app.changes.pending == SetShare("big", 0.5)
        assert [d[0] for d in discarded(inbox)] == ["server.split.discarded"]


async def test_quit_with_a_pending_change_asks_first() -> None:
    app, inbox = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "x", "l", "q")
        assert isinstance(app.screen, ChoiceScreen) and "Quit with a change pending?" in dialog_text(app)
        await pilot.press("escape")
        assert app.changes.pending == ServerAction("big", "stop") and not app.feed.closed
        await pilot.press("q", "q")
        await wait_for(pilot, lambda: app.feed.closed, what="the feed closing")
    assert discarded(inbox) == [("server.stop.request.discarded", "big", "discarded on quit")]


async def test_split_length_follows_the_gpus_the_server_runs_on() -> None:
    """A server with no `gpus` runs on every GPU of the rig: on the 2-GPU rig, 1,1,1 is refused."""
    specs = {"solo": ServerSpec(name="solo", model="/models/solo.gguf", port=8090)}
    app, _ = make_app(specs, profile="rtx5080+rtx3090")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "t")
        assert isinstance(app.screen, SplitForm)
        assert "on GPUs 0,1" in str(app.screen.query_one(".form-title", Static).content)
        await pilot.press("ctrl+a", "ctrl+k", *"1,1,1", "enter")
        assert isinstance(app.screen, SplitForm)  # nothing was proposed
        errors = str(app.screen.query_one("#form-errors", Static).content)
        assert errors == "solo runs on 2 GPUs (0,1): give 2 ratios, not 3"
        assert app.screen.query_one(Input).value == "1,1,1" and app.changes.pending is None
        await pilot.press("ctrl+a", "ctrl+k", *"1,2", "enter")
        assert isinstance(app.screen, ChoiceScreen) and "on GPUs 0,1" in dialog_text(app)


async def test_dialogs_fit_80x24_with_every_choice_visible() -> None:
    app, _ = make_app({"big": SPECS["big"]})
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "t", "ctrl+a", "ctrl+k", *"1,1", "enter")
        assert isinstance(app.screen, ChoiceScreen)
        await pilot.pause(0.05)
        form = app.screen.query_one(".form").region
        assert form.x >= 0 and form.right <= 80 and form.bottom <= 24
        keys = app.screen.query_one("#confirm-keys", Static)
        text = str(keys.content)
        assert "apply now" in text and "discard" in text
        # wrapped inside the dialog, never cut: every cell of the keys line has a place on screen
        assert keys.region.right <= 80 and keys.region.width * keys.region.height >= len(text)


async def test_a_pending_change_too_long_for_the_footer_gets_a_line_of_its_own_at_80x24() -> None:
    app, inbox = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "t", "ctrl+a", "ctrl+k", *"1,1", "enter", "l")
        bar = app.query_one(KeyBar)
        await pilot.pause(0.05)
        note, keys = footer(app).split("\n")
        assert bar.size.height == 2 and note.startswith("│ pending: set big tensor split to 1,1 (re-launches big)")
        assert keys.rstrip().endswith("?  Help  q  Quit") and " a  apply" in keys
        await pilot.press("escape")
        await pilot.pause(0.05)
        assert bar.size.height == 1 and "pending" not in footer(app)


async def test_a_share_outside_0_1_stays_in_its_form() -> None:
    app, _ = make_app({"big": SPECS["big"]})
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("3", "m", "ctrl+a", "ctrl+k", *"1.5", "enter")
        assert isinstance(app.screen, ShareForm)
        assert "memory share 1.5 is outside (0, 1]" in str(app.screen.query_one("#form-errors", Static).content)
        assert app.changes.pending is None


async def test_planned_split_is_proposed_with_p_and_confirmed_first() -> None:
    """16 GB + 24 GB sim rig, `big` split 1,1 over both: `p` proposes the planner's -ts in the re-launch
    dialog (applying it is tests/test_control.py's, with a real supervisor)."""
    specs = {"big": SPECS["big"].model_copy(update={"tensor_split": [1.0, 1.0]})}
    app, _ = make_app(specs, profile="rtx5080+rtx3090")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("2")
        await wait_for(pilot, lambda: "planner -ts" in str(app.query_one("#split-advice", Static).content),
                       what="the planner's split")
        advice = str(app.query_one("#split-advice", Static).content)
        assert "big: -ts 1,1 now" in advice and "follows free memory" in advice  # current, planned and why
        await pilot.press("p")
        assert isinstance(app.screen, ChoiceScreen)
        assert "Re-launch big with split -ts" in dialog_text(app) and "on GPUs 0,1" in dialog_text(app)
        assert isinstance(app.changes.pending, SetSplit)


async def test_k_on_a_supervised_server_s_process_offers_its_stop_first_then_the_signals() -> None:
    """K, as htop's, names the process and offers TERM, INT, KILL and HUP; for a server gpudash supervises,
    stopping it through its supervisor comes first (a signal alone would have it started again), and
    choosing it stops the server at once: the dialog said what it does."""
    app, inbox = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("9", "K")
        assert isinstance(app.screen, ChoiceScreen)
        keys = str(app.screen.query_one("#confirm-keys", Static).content)
        assert [k in keys for k in (" x  stop big (stays stopped)", " t  TERM", " i  INT", " k  KILL")] == [True] * 4
        assert "server big, which gpudash supervises" in dialog_text(app)
        await pilot.press("x")
        await wait_for(pilot, lambda: any(e.kind.startswith("server.stop") and e.target == "big"
                                          for e in inbox.poll().get("events", ())),
                       what="big's stop, applied without a second dialog")
        assert app.changes.pending is None and not isinstance(app.screen, ChoiceScreen)
