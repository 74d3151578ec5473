"""The Latency and Servers tabs at 80x24 (issue 36 items 4, 10 and 18; issue 37 item 5's Servers part): a
block whose text wraps once data arrives is laid out whole, the plots have room and a fraction's axis runs
from 0 to 1, an attached server's footer offers none of the keys that would act on it, and what a server
or its log says reaches the screen as text."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fixtures import FixedFeed, sim_snapshot
from textual.widgets import Log, Static
from tui_helpers import wait_for

from gpudash.records import RequestSample, ServerSample, Snapshot
from gpudash.tui.app import GpudashApp

pytestmark = pytest.mark.anyio


class LateFeed(FixedFeed):
    """Hands the first snapshot at start; the test hands the others when it wants (data that arrives later)."""

    def start(self, deliver):
        self.deliver = deliver
        first, self.snaps = self.snaps, self.snaps[:1]
        info = super().start(deliver)
        self.snaps = first
        return info


def _fits(block: Static) -> bool:
    """The block is as tall as its text, wrapped at its width, needs."""
    return block.size.height == block.get_content_height(block.parent.size, block.app.size, block.size.width)


async def test_latency_lays_out_wrapped_lines_that_arrive_later() -> None:
    quiet = replace(sim_snapshot(tick=0), requests=())
    busy = sim_snapshot(tick=1)
    feed = LateFeed([quiet, busy])
    app = GpudashApp(feed)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("4")  # before the probe's data
        await pilot.pause(0.1)
        for t in range(1, 4):
            feed.deliver(replace(busy, tick=t, ts=busy.ts + t))
        cache = app.query_one("#cache-kinds", Static)
        await wait_for(pilot, lambda: "prompt cache of big" in str(cache.content), what="the cache block")
        await pilot.pause(0.2)
        corr = app.query_one("#corr", Static)
        assert cache.size.height >= 2 and _fits(cache), (cache.size, str(cache.content))
        assert _fits(corr) and _fits(app.query_one("#server-own", Static))


async def test_latency_plots_have_room_at_80x24_and_the_hit_axis_is_0_to_1() -> None:
    snap = sim_snapshot(tick=0)
    one = (RequestSample(ts=snap.ts, server="big", ttft_s=0.05, total_s=0.1, prompt_tokens=100, cached_tokens=50),)
    app = GpudashApp(FixedFeed([replace(snap, requests=one)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("4")
        await pilot.pause(0.2)
        ttft, hit = app.query_one("#ttft-plot"), app.query_one("#hit-plot")
        assert ttft.size.height >= 6 and hit.size.height >= 6, (ttft.size, hit.size)  # they were 2 rows
        assert not app.query_one("#scatter-plot").display
        drawn = hit.render().plain
        assert "-0.33" not in drawn and "1.00" in drawn and "0.00" in drawn


def _attached(snap: Snapshot, error: str) -> Snapshot:
    ext = ServerSample(snap.ts, "ext", "llama.cpp", "unreachable", origin="attached", error=error,
                       url="http://10.0.0.9:8080")
    return replace(snap, servers=(ext,) + snap.servers)


async def test_an_attached_servers_footer_offers_no_key_that_acts_on_it() -> None:
    from fixtures import SPECS

    from gpudash.config import ServerSpec

    snap = _attached(sim_snapshot(tick=0), "unreachable: GET /metrics: [Errno 111] Connection refused")
    specs = {**SPECS, "ext": ServerSpec(name="ext", url="http://10.0.0.9:8080")}  # attached by its config entry
    app = GpudashApp(FixedFeed([snap], specs=specs))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("3")
        await pilot.pause(0.1)
        view = app.query_one("#servers-view")
        view.selected_server = "ext"
        view.show(app.state)
        app.refresh_keys()
        assert not any(view.offers(m) for m in ("server", "attach_found", "write_found"))
        title = str(app.query_one("#servers-title", Static).content)
        assert "attached: gpudash only reads it" in title and "S/x/R" not in title
        view.selected_server = "big"  # a server gpudash runs: start/stop/restart apply, attach/write do not
        view.show(app.state)
        assert view.offers("server") and not view.offers("attach_found")


async def test_what_a_server_or_its_log_says_is_shown_as_text() -> None:
    hostile = "unreachable: \x1b]0;pwned\x07\x1b[2J[link=file:///etc/shadow]x[/link]"
    snap = _attached(sim_snapshot(tick=0), hostile)
    app = GpudashApp(FixedFeed([snap]))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("3")
        await pilot.pause(0.1)
        view = app.query_one("#servers-view")
        from gpudash.tui import messages as msg

        view.selected_server = "big"
        view.post_message(msg.LogTail("big", ["ok line", "bad \x1b[31mred\x1b[0m \x07line"], False))
        await pilot.pause(0.2)
        table_text = " ".join(str(c) for r in range(view.query_one("#servers-table").row_count)
                              for c in view.query_one("#servers-table").get_row_at(r))
        assert "\x1b" not in table_text and "\\x1b]0;pwned\\x07" in table_text
        assert "[link=file:///etc/shadow]" in table_text  # shown as the characters it is, not a link
        lines = view.query_one(Log).lines
        assert lines[-1] == "bad \\x1b[31mred\\x1b[0m \\x07line"
