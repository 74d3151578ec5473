"""A driver fault (Xid) reaching the live app: a toast that stays 30 s, the GPU card's red line, and the
Events tab's row."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fixtures import FixedFeed, sim_snapshot
from tui_helpers import wait_for

from gpudash.records import Event
from gpudash.tui.app import GpudashApp
from gpudash.tui.widgets.overview import GpuCard

pytestmark = pytest.mark.anyio


async def test_an_xid_is_toasted_and_stays_on_its_card() -> None:
    snaps = [sim_snapshot(tick=t) for t in range(3)]
    fault = Event(snaps[1].ts, "driver", "gpu.xid", "GPU2", new=79, ok=False, reason="Xid 79: GPU has fallen off the bus")
    snaps[1] = replace(snaps[1], events=snaps[1].events + (fault,))
    app = GpudashApp(FixedFeed(snaps))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 3, what="the fixed feed")
        await pilot.pause()
        toasts = [n for n in app._notifications if n.title == "GPU fault"]
        assert [(n.message, n.severity, n.timeout) for n in toasts] == [
            ("GPU2: Xid 79: GPU has fallen off the bus", "error", 30)]
        card = app.query_one("#gpu-2", GpuCard)
        assert "Xid 79" in card.lines[1].plain  # right under the name
        assert "Xid" not in str(app.query_one("#gpu-1", GpuCard).render())
        assert fault in app.state.events  # the Events tab lists it
