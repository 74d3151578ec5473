"""The TUI's Fleet tab without a real fleet: unset, it asks no one and says how to set it; against a
Prometheus that is down or never answers, it shows "stale since" within the timeout while every other tab
keeps working. (Against the real fleet: test_fleet_prometheus.py.)"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from textual.widgets import Static

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))
from fixtures import FixedFeed, sim_snapshot  # noqa: E402
from tui_helpers import wait_for  # noqa: E402

from gpudash.config import Config
from gpudash.tui.app import GpudashApp

pytestmark = pytest.mark.anyio


class ConfiguredFeed(FixedFeed):
    """The fixed feed with a config, as LiveFeed has one."""

    def __init__(self, config: Config) -> None:
        super().__init__([sim_snapshot(tick=1)])
        self.config = config


def title(app: GpudashApp) -> str:
    return str(app.query_one("#fleet-view").query_one(".view-title", Static).content)


def fleet_workers(app: GpudashApp) -> list[str]:
    return [w.name for w in app.query_one("#fleet-view").workers if w.name.startswith("fleet")]


async def test_unset_the_tab_says_how_to_set_it_and_asks_no_one() -> None:
    app = GpudashApp(ConfiguredFeed(Config()))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("0")
        await pilot.pause(0.2)
        assert app.active_view == "fleet"
        assert "no Prometheus set ([fleet] prometheus, or launch --fleet URL)" in title(app)
        assert fleet_workers(app) == []


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(timeout=2)
        for c in held:
            c.close()
        srv.close()


@pytest.mark.parametrize("down", [True, False], ids=["refused", "never-answers"])
async def test_a_bad_prometheus_is_stale_since_and_nothing_else_stalls(down: bool, silent_port: int) -> None:
    if down:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed again: connections are refused
    else:
        port = silent_port
    config = Config.model_validate({"fleet": {"prometheus": f"http://127.0.0.1:{port}", "timeout_s": 1.0}})
    app = GpudashApp(ConfiguredFeed(config))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("0")
        t0 = time.monotonic()
        await wait_for(pilot, lambda: "stale since" in title(app), timeout=10, what="stale since")
        assert time.monotonic() - t0 < 4  # one read's timeout (1 s), not a hang
        assert f"127.0.0.1:{port}" in title(app) and "Traceback" not in title(app)
        t1 = time.monotonic()
        await pilot.press("1")  # the Overview answers at once while the fleet's reads keep failing
        await pilot.pause(0.05)
        assert app.active_view == "overview" and time.monotonic() - t1 < 1.5
