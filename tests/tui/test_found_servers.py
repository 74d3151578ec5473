"""A server found on the GPUs (a row the Servers view marks found): `A` attaches it for this run through
the controller, and `W` writes its [[servers]] entry (name, kind, url) into the config file."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures import FixedFeed, sim_snapshot
from tui_helpers import wait_for

from gpudash.runtime.control import Controller
from gpudash.records import ServerSample
from gpudash.telemetry.inbox import Inbox
from gpudash.tui.app import GpudashApp

pytestmark = pytest.mark.anyio

FOUND = ServerSample(ts=0.0, server="llamacpp-4242", kind="llama.cpp", state="found", pid=4242, port=8080,
                     origin="found", url="http://127.0.0.1:8080")


class _Attaching:
    """A supervisor as the controller sees it, recording what it was asked to attach."""

    def __init__(self) -> None:
        self.attached: list = []

    def specs(self) -> dict:
        return {s.name: s for s in self.attached}

    def states(self) -> list:
        return []

    def attach(self, spec) -> None:
        self.attached.append(spec)


async def test_a_found_server_is_attached_with_A_and_written_with_W(tmp_path: Path) -> None:
    inbox, sup = Inbox(), _Attaching()
    snaps = [replace(sim_snapshot(tick=t), servers=(replace(FOUND, ts=float(t)),)) for t in range(3)]
    config = tmp_path / "gpudash.toml"
    config.write_text('[sampling]\ninterval_s = 1.0\n')
    app = GpudashApp(FixedFeed(snaps, specs={}, controller=Controller(supervisor=sup, inbox=inbox)),
                     config_path=config)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.info is not None and app.state.ticks == 3, what="the fixed feed")
        await pilot.press("3", "A")
        await wait_for(pilot, lambda: sup.attached, what="the attach")
        (spec,) = sup.attached
        assert (spec.name, spec.kind, spec.url) == ("llamacpp-4242", "llama.cpp", "http://127.0.0.1:8080")
        assert spec.attached
        await pilot.press("W")
        await wait_for(pilot, lambda: "servers" in tomllib.loads(config.read_text()), what="the entry written")
    data = tomllib.loads(config.read_text())
    assert data["sampling"] == {"interval_s": 1.0}
    assert data["servers"] == [{"name": "llamacpp-4242", "kind": "llama.cpp", "url": "http://127.0.0.1:8080"}]
    events = [e for e in inbox.poll()["events"] if e.kind == "server.attach"]
    assert len(events) == 1 and events[0].ok
