"""What nvitop's and htop's users expect (issue 45, 18): F1 and h open the keys' help, F10 quits; History's export proposes a folder in the user's data folder, not the current directory (often
the git checkout gpudash was started from)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
import pytest
from fixtures import FixedFeed, OneSessionFeed, sim_snapshot
from textual.widgets import DataTable, Input
from tui_helpers import open_export_form, wait_for

from gpudash.tui.app import GpudashApp
from gpudash.tui.screens.dialogs import HelpScreen

pytestmark = pytest.mark.anyio


async def test_f1_and_h_toggle_help_and_f10_quits() -> None:
    feed = FixedFeed([sim_snapshot(tick=0)])
    app = GpudashApp(feed)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
        for key in ("f1", "h"):
            await pilot.press(key)
            assert isinstance(app.screen, HelpScreen)
            await pilot.press(key)  # the key that opened it closes it, as in htop
            assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f10")
        await wait_for(pilot, lambda: feed.closed, what="F10 to quit")


async def test_history_export_proposes_the_users_data_folder(tmp_path: Path, monkeypatch) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)  # started from a clone, as the README's test command is
    app = GpudashApp(OneSessionFeed([sim_snapshot(tick=0)], tmp_path / "h.db"))
    async with app.run_test(size=(80, 24)) as pilot:
        form = await open_export_form(pilot, app)
        folder = Path(form.query_one("#export-folder", Input).value)
        assert folder.is_relative_to(platformdirs.user_data_dir("gpudash"))
        assert not folder.is_relative_to(os.getcwd())


async def test_history_lists_recordings_not_server_actions(tmp_path: Path) -> None:
    """A `gpudash server sleep` attempt writes its events under a session of its own (source "cli"): it is no
    recording, and the History tab lists it no more than `gpudash history` does among the sessions."""
    from gpudash.config import Config
    from gpudash.runtime.history import ACTION_SOURCE
    from gpudash.store import Store

    feed = OneSessionFeed([sim_snapshot(tick=0)], tmp_path / "h.db")
    with Store.open(feed.db) as store:
        store.end_session(store.begin_session(ACTION_SOURCE, Config(), note="gpudash server sleep v"))
    app = GpudashApp(feed)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
        await pilot.press("7")
        view = app.query_one("#history-view")
        await wait_for(pilot, lambda: view.query_one(DataTable).row_count >= 1, what="the sessions list")
        assert [s.note for s in view.sessions] == ["gpudash record"]
