"""The views say what a server's tokens cost: the Servers view's J/token column and the selected server's
energy line (per generated token and per 1,000 prompt tokens, last minute and session, tokens per kWh, busy
and idle, the split), the Overview's line of every counted server, and "—" where no token was generated."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Static

from gpudash.records import ServerEnergySample
from gpudash.tui.app import GpudashApp
from gpudash.tui.widgets.energy import detail, joules, overview_line
from gpudash.tui.widgets.fitted import FittedTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))
from fixtures import FixedFeed, sim_snapshot  # noqa: E402
from tui_helpers import wait_for  # noqa: E402

BIG = ServerEnergySample(0.0, "big", "0,1", "sm_share", busy_j=3000.0, idle_j=600.0, generation_tokens=12000.0,
                         prompt_tokens=48000.0, j_per_token_1m=0.25, j_per_kprompt_1m=70.0, unattributed_j=15.0)


def test_the_texts() -> None:
    assert [joules(x) for x in (None, 0.25, 1234.5, 3.6e6)] == ["—", "0.25 J", "1.23 kJ", "3.6 MJ"]
    line = detail(BIG)
    assert "0.25 J/token, 70 J/1k prompt tokens (last minute)" in line
    assert "session 0.3 J/token, 75 J/1k prompt" in line  # 3600 J over 12 000 and 48 000 tokens
    assert "12M tokens/kWh" in line  # 12 000 tokens per 3600 J = 1 Wh
    assert "busy 3 kJ, idle 600 J on GPU 0,1 (sm_share)" in line and "15 J of shared GPUs unattributed" in line
    quiet = replace(BIG, generation_tokens=0.0, j_per_token_1m=None)
    assert str(overview_line([BIG, quiet], 200)) == "J/token 1m / session: big 0.25 J / 0.3 J  big — / —"
    assert str(overview_line([], 80)) == ""


@pytest.mark.anyio
async def test_servers_view_and_overview_show_joules_per_token() -> None:
    snap = replace(sim_snapshot(tick=1), server_energy=(replace(BIG, ts=sim_snapshot(tick=1).ts),))
    app = GpudashApp(FixedFeed([snap]))
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        line = app.query_one("#energy-line", Static)
        await wait_for(pilot, lambda: "big 0.25 J / 0.3 J" in str(line.content), what="the overview's energy line")
        await pilot.press("3")
        table = app.query_one("#servers-table", FittedTable)
        await wait_for(pilot, lambda: table.row_count == 2, what="the servers")
        column = [str(c.label) for c in table.columns.values()].index("J/token 1m")
        assert [str(table.get_row_at(r)[column]) for r in range(2)] == ["0.25 J", "—"]  # small: none counted
        await wait_for(pilot, lambda: "energy: 0.25 J/token" in str(app.query_one("#server-detail", Static).content),
                       what="the selected server's energy line")
