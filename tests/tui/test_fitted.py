"""Tables fit the screen by hiding columns in their declared order: at 80x24 every column shown is on
screen (the tables take no focus, so nothing past the edge could be scrolled to) and a line says what
is not shown; at 200 columns everything shows."""

from __future__ import annotations

import pytest
from fixtures import FixedFeed, sim_snapshot
from rich.text import Text
from tui_helpers import wait_for

from gpudash.tui.app import GpudashApp
from gpudash.tui.widgets.fitted import LAST_COLUMN_CELLS, FittedTable, fit_columns

LABELS = ("name", "kind", "state", "note")
ROWS = [("alpha", "llama.cpp", Text("relaunching"), "x" * 60)]


def test_columns_give_way_in_order_until_the_rest_fits() -> None:
    # widths with padding: name 7, kind 11, state 13, note 62 counted as LAST_COLUMN_CELLS (free text, cut)
    assert fit_columns(LABELS, ROWS, ("kind", "state"), 200) == (0, 1, 2, 3)
    assert fit_columns(LABELS, ROWS, ("kind", "state"), 7 + 11 + 13 + LAST_COLUMN_CELLS) == (0, 1, 2, 3)
    assert fit_columns(LABELS, ROWS, ("kind", "state"), 7 + 13 + LAST_COLUMN_CELLS) == (0, 2, 3)
    assert fit_columns(LABELS, ROWS, ("kind", "state"), 10) == (0, 3)  # nothing more may go: the rest is cut


def test_a_drop_order_must_name_the_table_s_columns() -> None:
    with pytest.raises(ValueError, match="bogus"):
        FittedTable(LABELS, ("bogus",))



@pytest.mark.anyio
@pytest.mark.parametrize("size, hidden", [((80, 24), ("kind", "port", "running")), ((200, 60), ())])
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
        assert {"server", "state", "tok/s 10s", "crashes", "KV use"} <= set(shown)
