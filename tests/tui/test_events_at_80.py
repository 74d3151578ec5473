"""Events at 80x24 (issue 45, 10): every row says whether it happened (the status column shows, or is
named among the columns not shown), a launcher step that failed reads `failed` and only a change someone
asked for reads `refused`, and the scrollbar never covers text."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fixtures import FixedFeed, sim_snapshot
from textual.widgets import DataTable
from tui_helpers import screen_lines, wait_for

from gpudash.records import Event
from gpudash.tui.app import GpudashApp

pytestmark = pytest.mark.anyio

LOG = "/root/.cache/gpudash/llama-server/.build/logs/11434.0.0-cpu-20261205T120000.000000Z-4242.log"


def _events(ts: float) -> tuple[Event, ...]:
    failed = Event(ts, "launcher", "llama.build", "llama-server", old="none", new="cpu", ok=False,
                   reason=f"compiling llama-server failed (cmake exited 2); the full log is {LOG}")
    refused = Event(ts + 1, "keyboard", "engine.knobs", "engine", old={"outstanding": 2}, new={"outstanding": 99},
                    ok=False, reason="outstanding must be at most 64")
    many = tuple(Event(ts + 2 + i, "launcher", "server.ready", f"demo{i}", new="ready") for i in range(30))
    return (failed, refused, *many)


async def test_events_at_80x24_say_failed_refused_and_ok() -> None:
    snap = sim_snapshot(tick=1)
    app = GpudashApp(FixedFeed([replace(snap, events=_events(snap.ts))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 1 and app.info is not None, what="the fixed feed")
        await pilot.press("8")
        await pilot.pause(0.1)
        table = app.query_one("#events-view").query_one(DataTable)
        labels = [str(c.label).split()[0] for c in table.columns.values()]
        assert "status" in labels
        kind, status = labels.index("kind"), labels.index("status")
        cells = {str(table.get_row_at(i)[kind]): str(table.get_row_at(i)[status]) for i in range(table.row_count)}
        assert cells["llama.build"] == "failed" and cells["engine.knobs"] == "refused"
        assert cells["server.ready"] == "ok"
        screen = screen_lines(app)
        header = next(line for line in screen if " status " in line)
        assert header.index(" status ") + len(" status") <= table.scrollable_content_region.width  # not under the bar
