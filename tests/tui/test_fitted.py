"""Tables fit the screen by hiding columns in their declared order: at 80x24 every column shown is on
screen (the tables take no focus, so nothing past the edge could be scrolled to) and a line says what
is not shown; at 200 columns everything shows."""

from __future__ import annotations

import pytest
from fixtures import FixedFeed, sim_snapshot
from rich.text import Text
from tui_helpers import wait_for

from gpudash.tui.app import GpudashApp
from gpudash.tui.widgets.fitted import LAST_COLUMN_CELLS, Fit, FittedTable, fit_columns

LABELS = ("name", "kind", "state", "note")
ROWS = [("alpha", "llama.cpp", Text("relaunching"), "x" * 60)]


def test_columns_give_way_in_order_until_the_rest_fits() -> None:
    # widths with padding: name 7, kind 11, state 13, note 62 counted as LAST_COLUMN_CELLS (free text, cut)
    # the note runs past the edge (last_cut) wherever the line is narrower than its 62 cells
    assert fit_columns(LABELS, ROWS, ("kind", "state"), 200) == Fit((0, 1, 2, 3))
    assert fit_columns(LABELS, ROWS, ("kind", "state"), 7 + 11 + 13 + LAST_COLUMN_CELLS) == Fit((0, 1, 2, 3), (), True)
    assert fit_columns(LABELS, ROWS, ("kind", "state"), 7 + 13 + LAST_COLUMN_CELLS) == Fit((0, 2, 3), (), True)
    assert fit_columns(LABELS, ROWS, ("kind", "state"), 10) == Fit((0, 3), (), True)  # nothing more may go


def test_after_the_drops_some_columns_narrow_to_their_minimum() -> None:
    # drop kind (11) first; then state (13 with padding) narrows by what is still over, to no less than 6 + 2
    assert fit_columns(LABELS, ROWS, ("kind",), 7 + 10 + LAST_COLUMN_CELLS, {"state": 6}) == \
        Fit((0, 2, 3), ((2, 8),), True)
    assert fit_columns(LABELS, ROWS, ("kind",), 20, {"state": 6}) == Fit((0, 2, 3), ((2, 6),), True)
    assert fit_columns(LABELS, ROWS, ("kind",), 200, {"state": 6}) == Fit((0, 1, 2, 3))


def test_a_drop_order_must_name_the_table_s_columns() -> None:
    with pytest.raises(ValueError, match="bogus"):
        FittedTable(LABELS, ("bogus",))
    with pytest.raises(ValueError, match="nope"):
        FittedTable(LABELS, (), {"nope": 4})



@pytest.mark.anyio
@pytest.mark.parametrize("size, hidden", [((80, 24), ("kind", "port", "prefill tok/s 10s", "relaunches", "J/token 1m")),
                                         ((200, 60), ())])
async def test_the_servers_table_fits_the_screen(size: tuple[int, int], hidden: tuple[str, ...]) -> None:
    app = GpudashApp(FixedFeed([sim_snapshot(tick=t) for t in range(3)]))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 3 and app.info is not None, what="the fixed feed")
        await pilot.press("3")
        await pilot.pause(0.1)
        table = app.query_one("#servers-table", FittedTable)
        assert table.virtual_size.width <= table.scrollable_content_region.width
        assert table.hidden == hidden
        note = str(app.query_one("#servers-view").query_one(".hidden-columns").render())
        assert (note == "") == (not hidden) and all(h in note for h in hidden)
        shown = [c.label.plain for c in table.columns.values()]
        assert shown == [c for c in table.labels if c not in hidden]
        assert {"server", "state", "tok/s 10s", "run/wait", "crashes", "KV use"} <= set(shown)


@pytest.mark.anyio
async def test_events_keep_old_and_new_at_80x24_narrowed() -> None:
    """At 80 columns the Events table hides the actor and narrows old and new (cut with …) so that the
    status shows; at 160 the table cuts nothing (a long value keeps the event row's own 40 characters)."""
    from dataclasses import replace

    from gpudash.records import Event

    snap = sim_snapshot(tick=0)
    spec = {"name": "big", "model": "/models/big.gguf", "gpus": [0, 1], "ctx_size": 8192}
    events = (Event(snap.ts, "supervisor", "server.start", "big", None, spec),
              Event(snap.ts, "keyboard", "server.split", "big", [1.0, 1.0], [2.0, 3.0]))
    for size, hidden, cells in (((80, 24), ("actor",), range(16, 40)), ((160, 48), (), [40])):  # 40: the row's own cut
        app = GpudashApp(FixedFeed([replace(snap, events=events)]))
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.state.ticks == 1 and app.info is not None, what="the fixed feed")
            await pilot.press("8")
            await pilot.pause(0.1)
            table = app.query_one("#events-view").query_one(FittedTable)
            labels = [c.label.plain for c in table.columns.values()]
            assert table.hidden == hidden and "status" in labels
            start = [str(c) for c in table.get_row_at(1)]  # newest first: the split, then the start
            new = start[labels.index("new")]
            assert new.endswith("…") and len(new) in cells and new.startswith("name=big, model=")
            assert sum(c.get_render_width(table) for c in table.columns.values()) - table.columns[
                list(table.columns)[-1]].get_render_width(table) <= size[0]  # all but the last column fit
