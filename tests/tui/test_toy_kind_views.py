"""The third server kind of the seam test (tests/launcher/toy_kind.py: one file, one registry line) in every
view: the views know servers only through their samples and specs, so a kind they never heard of shows
with its name and figures where a server's figures show, and no view fails on it."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures import FixedFeed, sim_snapshot
from tui_helpers import wait_for

from gpudash.config import ServerSpec
from gpudash.records import ServerSample
from gpudash.tui.actions import VIEWS
from gpudash.tui.app import GpudashApp
from gpudash.tui.widgets.fitted import FittedTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launcher"))  # toy_kind.py lives beside its test
from toy_kind import register  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_the_toy_kind_shows_in_every_view(monkeypatch: pytest.MonkeyPatch) -> None:
    register(monkeypatch)  # the registry lines
    spec = ServerSpec(name="toy1", kind="toy", speed=50, gpus=[0])
    toy = ServerSample(ts=0.0, server="toy1", kind="toy", state="ready", pid=777, port=9999, tokens_per_s=50.0,
                       uptime_s=3.0)
    snaps = [replace(sim_snapshot(tick=t), servers=(replace(toy, ts=float(t)),)) for t in range(3)]
    app = GpudashApp(FixedFeed(snaps, specs={"toy1": spec}))
    seen: dict[str, str] = {}
    servers_rows: list = []
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.info is not None and app.state.ticks == 3, what="the fixed feed")
        for i, view in enumerate(VIEWS):
            await pilot.press(str((i + 1) % 10))
            await pilot.pause()
            seen[view.id] = " ".join(str(w.render()) for w in app.screen.query("Static"))
            if view.id == "servers":
                servers_rows = list(app.screen.query_one("#servers-table", FittedTable)._rows or [])
    ((name, kind, state, port, *_),) = servers_rows
    assert (name, kind, str(state), port) == ("toy1", "toy", "ready", 9999)
    assert "no figures of their own from toy1 (ready)" in seen["latency"]  # it exports tok/s only
    assert set(seen) == {v.id for v in VIEWS}  # every view drew with the toy server in its samples
