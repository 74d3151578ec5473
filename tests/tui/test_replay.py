"""Replay: a session written to a real SQLite file by the real StoreWriter, played back through
`gpudash replay`'s app with pause, step, seek and speed keys; events show at the moment they happened."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner
import pytest
from textual.widgets import DataTable, Static
from tui_helpers import wait_for
from fixtures import sim_snapshot

from gpudash.cli import main
from gpudash.config import Config
from gpudash.records import Event
from gpudash.store import Store, StoreWriter
from gpudash.tui.app import GpudashApp
from gpudash.runtime.replay import ReplayFeed
from gpudash.tui.screens.forms import KnobForm

TICKS = 40
CHANGE_TICK = 25

pytestmark = pytest.mark.anyio


def record_session(db: Path) -> int:
    store = Store.open(db)
    sid = store.begin_session("sim:8xh20", Config())
    writer = StoreWriter(db, sid, flush_interval_s=0.1)
    for t in range(TICKS):
        snap = sim_snapshot("8xh20", tick=t)
        if t == CHANGE_TICK:
            snap = replace(snap, events=(Event(snap.ts, "keyboard", "server.split", "big", [1.0, 1.0], [2.0, 3.0]),))
        writer.submit(snap)
    writer.close()
    store.end_session(sid)
    store.close()
    return sid


def split_seen(app: GpudashApp) -> bool:
    return any(e.kind == "server.split" for e in app.state.events)


async def test_replay_pause_step_seek_and_speed(tmp_path: Path) -> None:
    db = tmp_path / "rec.db"
    record_session(db)
    app = GpudashApp(ReplayFeed(db, "latest"), replay=True, speed=1.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.player is not None and app.player.index >= 0, what="the recording")
        await pilot.press("space")
        assert app.player.paused
        assert app.header.source.startswith("replay:") and "sim:8xh20" in app.header.source
        await pilot.press(*["left_square_bracket"] * 5)  # seek back to the first tick
        assert app.player.index == 0 and app.state.latest.tick == 0
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert app.player.index == 20 and app.state.latest.tick == 20
        assert any(e.kind == "server.ready" for e in app.state.events)  # tick 1's event
        assert not split_seen(app)  # tick 25's change has not happened yet
        assert len(app.state.link_history[0][0]) == 21  # plots rebuilt from the ticks before the seek point
        await pilot.press("right_square_bracket")
        assert app.player.index == 30 and split_seen(app)
        await pilot.press("left_square_bracket")
        assert app.player.index == 20 and not split_seen(app)
        await pilot.press("full_stop")
        assert app.player.index == 21 and app.state.latest.tick == 21
        await pilot.press("plus")
        assert app.player.speed == 2.0
        assert "tick 22/40" in app.header.position and "2x" in app.header.position
        await pilot.press("k")  # changes are live-only: no form opens in replay
        assert not isinstance(app.screen, KnobForm)
        await pilot.press("space")  # play on at 2x until the end
        await pilot.press(*["right_square_bracket"] * 3)
        await wait_for(pilot, lambda: app.player.done, what="the end of the recording")
        assert app.state.latest.tick == TICKS - 1 and "END" in app.header.position


def test_replay_cli_usage_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["replay", "latest", "--db", str(tmp_path / "none.db")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    db = tmp_path / "empty.db"
    Store.open(db).close()
    empty = runner.invoke(main, ["replay", "latest", "--db", str(db)])
    assert empty.exit_code == 2 and "has no sessions yet" in empty.output
    record_session(db)
    unknown = runner.invoke(main, ["replay", "99", "--db", str(db)])
    assert unknown.exit_code == 2 and "no session 99" in unknown.output
    slow = runner.invoke(main, ["replay", "latest", "--db", str(db), "--speed", "0"])
    assert slow.exit_code == 2 and "--speed must be above 0" in slow.output


async def test_replay_moves_knobs_and_split_with_the_recorded_events(tmp_path: Path) -> None:
    from gpudash.config import ServerSpec

    db = tmp_path / "rec.db"
    store = Store.open(db)
    cfg = Config(servers=[ServerSpec(name="big", model="m.gguf", gpus=[0, 1], tensor_split=[1, 1])])
    sid = store.begin_session("sim:8xh20", cfg)
    writer = StoreWriter(db, sid, flush_interval_s=0.1)
    for t in range(20):
        snap = sim_snapshot("8xh20", tick=t)
        if t == 10:
            snap = replace(snap, events=(
                Event(snap.ts, "keyboard", "engine.knobs", "engine", {"outstanding": 2}, {"outstanding": 5}),
                Event(snap.ts, "keyboard", "server.split", "big", [1.0, 1.0], [2.0, 3.0])))
        writer.submit(snap)
    writer.close()
    store.end_session(sid)
    store.close()
    app = GpudashApp(ReplayFeed(db, str(sid)), replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.player is not None and app.player.index >= 0, what="the recording")
        await pilot.press("space", *["left_square_bracket"] * 3, "5")
        assert app.state.knobs["outstanding"] == 2 and app.state.specs["big"].tensor_split == [1.0, 1.0]
        assert "REPLAY" in str(app.header.render()) and "SIM 8xh20" in str(app.header.render())
        await pilot.press("right_square_bracket")  # tick 10: the change happened
        assert app.state.knobs["outstanding"] == 5 and app.state.specs["big"].tensor_split == [2.0, 3.0]
        assert "outstanding=5" in str(app.query_one("#knobs").content)
        await pilot.press("left_square_bracket")
        assert app.state.knobs["outstanding"] == 2


async def test_a_recording_from_before_slabs_replays_them_as_na(tmp_path: Path) -> None:
    """A DB written at schema v5 has shard rows only: the Pools view shows its shards, and its slab line
    says — for the slab and unassigned bytes it never recorded, at 80x24 too."""
    db = tmp_path / "v5.db"
    con = sqlite3.connect(db)
    con.executescript((Path(__file__).parents[1] / "store" / "data" / "schema_v5.sql").read_text())
    con.close()
    app = GpudashApp(ReplayFeed(db, "latest"), replay=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.player is not None and app.player.index >= 0, what="the recording")
        await pilot.press("space", "right_square_bracket", "6")  # tick 7, the last: raw shard rows
        assert app.state.latest.tick == 7 and app.state.latest.pools == ()
        assert str(app.query_one("#pool-slabs", Static).content) == "pinned: slab — · 1 shard · — unassigned"
        table = app.query_one("#pools-view").query_one(DataTable)
        assert table.get_row_at(0)[:3] == ["pinned", "numa0", "1.0 GiB"]


async def test_replay_header_at_80x24_keeps_position_speed_and_the_word_simulated(tmp_path: Path) -> None:
    db = tmp_path / "rec.db"
    record_session(db)
    app = GpudashApp(ReplayFeed(db, "latest"), replay=True, speed=1.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.player is not None and app.player.index >= 0, what="the recording")
        await pilot.press("space", "plus")
        await pilot.pause(0.05)
        line = str(app.header.render())
        assert len(line) <= 80, line
        assert f"tick {app.player.index + 1}/{TICKS}  2x  PAUSED" in line and "simulated" in line, line
        assert "REPLAY" in line and "SIM 8xh20" in line
