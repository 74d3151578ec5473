"""The TUI's Fleet tab without a real fleet: unset, it asks no one and says how to set it; against a
Prometheus that is down, never answers or drips its headers, it says why under the title, in full and on
screen at 80 and 160 columns ("cannot reach Prometheus at ...", as `gpudash fleet` does), within the
timeout, while every other tab keeps working. (Against the real fleet: test_fleet_prometheus.py.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
import sys
import threading
import time
from pathlib import Path

import pytest
from textual.widgets import Static

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))
from fixtures import FixedFeed, sim_snapshot  # noqa: E402
from fleet_helpers import raw_port  # noqa: E402
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


def note(app: GpudashApp) -> str:
    """The line under the Fleet's title as it is drawn on screen ("" when it is not shown), wrapped lines
    joined: what a user reads there."""
    from textual.geometry import Region

    empty = app.query_one("#fleet-view").query_one(".empty", Static)
    if not empty.display or empty.region.height == 0 or empty.region.bottom > app.screen.size.height:
        return ""
    strips = empty.render_lines(Region(0, 0, empty.region.width, empty.region.height))
    return " ".join("".join(seg.text for seg in strip).strip() for strip in strips).strip()


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


def _silent(conn: socket.socket, stop: threading.Event) -> None:
    """Accept, never answer."""
    stop.wait()


def _drip(conn: socket.socket, stop: threading.Event) -> None:
    """A status line, then one header byte every 0.2 s (issue 37.2)."""
    try:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.2):
            conn.sendall(b"a")
    except OSError:
        pass


@pytest.fixture
def silent_port() -> Iterator[int]:
    with raw_port(_silent) as port:
        yield port


@pytest.fixture
def dripping_port() -> Iterator[int]:
    with raw_port(_drip) as port:
        yield port


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
@pytest.mark.parametrize("how, words", [("refused", "cannot reach Prometheus at"),
                                        ("never-answers", "did not answer within 1 s"),
                                        ("drips-headers", "did not answer within 1 s")])
async def test_a_bad_prometheus_says_why_on_screen_and_nothing_else_stalls(
        how: str, words: str, size: tuple[int, int], silent_port: int, dripping_port: int) -> None:
    if how == "refused":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed again: connections are refused
    else:
        port = silent_port if how == "never-answers" else dripping_port
    url = f"http://127.0.0.1:{port}"
    config = Config.model_validate({"fleet": {"prometheus": url, "timeout_s": 1.0}})
    app = GpudashApp(ConfiguredFeed(config))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("0")
        t0 = time.monotonic()
        await wait_for(pilot, lambda: words in note(app), timeout=10, what=words)
        assert time.monotonic() - t0 < 4  # one read's timeout (1 s), not a hang
        shown = note(app)
        assert f"{'cannot reach ' if how == 'refused' else ''}Prometheus at {url}" in shown, shown
        assert "no boxes yet" not in shown and "Traceback" not in shown
        t1 = time.monotonic()
        await pilot.press("1")  # the Overview answers at once while the fleet's reads keep failing
        await pilot.pause(0.05)
        assert app.active_view == "overview" and time.monotonic() - t1 < 1.5


async def test_sixty_boxes_at_80x24_page_with_the_cursor() -> None:
    """Only the page the cursor is on is drawn; moving past its end turns the page. The fleet here is
    records handed to the view (no Prometheus answers: its reads fail, the rows stay, marked stale)."""
    from gpudash.fleet.boxes import Fleet, FleetBox
    from gpudash.tui import messages as msg
    from gpudash.tui.widgets.fleet import FleetView
    from gpudash.tui.widgets.lines import TextLines

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Config.model_validate({"fleet": {"prometheus": f"http://127.0.0.1:{port}", "timeout_s": 0.5}})
    boxes = tuple(FleetBox(f"box{i:02d}", "up", gpu_count=8, util=i / 100, rig="sim:8xh20") for i in range(60))
    app = GpudashApp(ConfiguredFeed(config))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("0")
        view = app.query_one("#fleet-view", FleetView)
        view.sort = 0  # by box name
        view.post_message(msg.FleetRead(Fleet("http://x", 0.0, boxes), None))
        await wait_for(pilot, lambda: len(view.rows) == 60, what="the boxes")
        await wait_for(pilot, lambda: "stale since" in note(app), what="the first failed read")  # layout settled
        await pilot.pause(0.1)
        lines = view.query_one("#fleet-lines", TextLines)

        def page() -> list[str]:
            return [line.plain.split()[0] for line in lines.lines[1:]]

        first = page()
        assert first[0] == "box00" and 5 < len(first) < 24 and all(len(x.plain) <= 80 for x in lines.lines)
        paging = str(view.query_one(".hidden-columns", Static).content)
        assert f"boxes 1-{len(first)} of 60" in paging
        for _ in range(30):  # down to the end of the page, and one more
            if view.top:
                break
            await pilot.press("down")
            await pilot.pause(0.02)
        top, shown = view.top, page()
        assert top == 1 and shown[0] == "box01" and shown[-1] == f"box{view.cursor:02d}"
        assert len(shown) == len(first)  # the page keeps its size
        await pilot.press("up")  # back up inside the page: it stays
        await pilot.pause(0.05)
        assert view.top == top and page() == shown


async def test_a_tick_leaves_the_fleet_as_it_is_and_a_read_redraws_it() -> None:
    """The app redraws the view on screen at every tick; the Fleet draws from its own reads, so a tick
    leaves its rows as they are (redrawing them twice a second was most of the tab's CPU) and a read,
    a key or a new size draws them again."""
    from gpudash.fleet.boxes import Fleet, FleetBox
    from gpudash.tui import messages as msg
    from gpudash.tui.widgets.fleet import FleetView

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # refused: the view's own reads fail and keep the rows it was handed
    config = Config.model_validate({"fleet": {"prometheus": f"http://127.0.0.1:{port}", "timeout_s": 0.5}})

    def fleet(n: int) -> Fleet:
        return Fleet("http://x", 0.0, tuple(FleetBox(f"box{i}", "up", gpu_count=1) for i in range(n)))

    app = GpudashApp(ConfiguredFeed(config))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("0")
        view = app.query_one("#fleet-view", FleetView)
        view.post_message(msg.FleetRead(fleet(3), None))
        await wait_for(pilot, lambda: len(view.rows) == 3, what="the boxes")
        await wait_for(pilot, lambda: "stale since" in note(app), what="the first failed read")
        await pilot.pause(0.1)
        drawn = view.rows
        assert app.view is view
        for _ in range(5):
            app.refresh_views()  # what every tick does
            await pilot.pause(0.02)
        assert view.rows is drawn  # not drawn again
        await pilot.press("down")
        await wait_for(pilot, lambda: view.rows is not drawn, what="the cursor's redraw")
        view.post_message(msg.FleetRead(fleet(4), None))
        await wait_for(pilot, lambda: len(view.rows) == 4, what="the new read's rows")
