"""Issue 45 items 4, 5, 6 and 17 (server parts), issue 43 items 3, 4 and 6 on screen: servers gpudash did not
start are shown and offered only what applies to them.

Processes `K` on an attached server's process says gpudash never signals it (it opened a dialog saying it was
supervised, then refused); a found server's row says its health once ("found (found)" before), its log pane
says there is none here (it asked the supervisor, and wrote worker.error rows), `S` on it says why nothing
happens, `A` then `W` keeps it under its host:port name and says the next launch runs no demo; Latency at 80x24
with five servers keeps its plots and gives found servers no lines of dashes; the hit rate under "over the
last minute" is the minute's; requests running and waiting have a column; an attached server's port column
shows its url's port; Servers with nothing configured and no demo does not promise a launcher."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures import SPECS, FixedFeed, sim_snapshot
from textual.widgets import Log, Static
from test_found_servers import _Attaching  # a supervisor that records what it attaches
from tui_helpers import wait_for

from gpudash.config import ServerSpec
from gpudash.records import GpuProcessSample, ServerSample, Snapshot
from gpudash.tui.app import GpudashApp

pytestmark = pytest.mark.anyio

FOUND = [ServerSample(0.0, f"127.0.0.1:{port}", "llama.cpp", "found", pid=4000 + port % 10, port=port, origin="found",
                      url=f"http://127.0.0.1:{port}", answers=port != 8082) for port in (8080, 8081, 8082)]
EXT = ServerSample(0.0, "ext", "llama.cpp", "ready", origin="attached", url="http://10.0.0.9:9090",
                   requests_running=2.0, requests_waiting=1.0, prefill_busy=0.12, prefix_cache_hits=650.0,
                   prefix_cache_queries=1000.0, prefix_cache_hit_rate=0.75, itl_mean_s=0.012)
EXT_SPEC = ServerSpec(name="ext", url="http://10.0.0.9:9090")


def with_servers(snap: Snapshot, *servers: ServerSample) -> Snapshot:
    return replace(snap, servers=tuple(replace(s, ts=snap.ts) for s in servers) + snap.servers)


def said(app: GpudashApp) -> list[str]:
    return [n.message for n in app._notifications]


def table_text(view) -> str:
    table = view.query_one("#servers-table")
    return " | ".join(" ".join(str(c) for c in table.get_row_at(r)) for r in range(table.row_count))


async def test_k_on_an_attached_servers_process_offers_nothing_it_would_refuse() -> None:
    snap = with_servers(sim_snapshot(tick=0), EXT)
    snap = replace(snap, gpu_processes=(GpuProcessSample(snap.ts, 0, 31337, 2**30, "llama-server", "ext"),))
    app = GpudashApp(FixedFeed([snap], specs={**SPECS, "ext": EXT_SPEC}))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("9")
        view = app.query_one("#processes-view")
        await wait_for(pilot, lambda: view._shown, what="the process rows")
        view.cursor = next(i for i, r in enumerate(view._shown) if r.pid == 31337)
        await pilot.press("K")
        await pilot.pause(0.1)
        assert app.screen is app.screen_stack[0]  # no dialog
        assert any("attached server ext: gpudash only reads it and never stops or signals it" in m for m in said(app))


async def test_found_servers_on_the_servers_tab_say_what_they_are_and_what_applies(tmp_path: Path) -> None:
    snap = with_servers(sim_snapshot(tick=0), EXT, *FOUND)
    app = GpudashApp(FixedFeed([snap], specs={**SPECS, "ext": EXT_SPEC}, controller=None))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("3")
        await pilot.pause(0.1)
        view = app.query_one("#servers-view")
        text = table_text(view)
        assert "found (found)" not in text and "up (found)" in text and "no answer (found)" in text
        assert "2/1" in text  # ext's requests running / waiting, as it reports them
        view.selected_server = "127.0.0.1:8080"
        view.show(app.state)
        view.selection_moved()
        await pilot.pause(0.2)
        title = str(app.query_one("#log-title", Static).content)
        assert "none here for 127.0.0.1:8080: gpudash did not start it (found)" in title
        assert not app.query_one(Log).lines
        await pilot.press("S")
        await pilot.pause(0.1)
        assert any("127.0.0.1:8080 runs on this box but gpudash did not start it: A attaches it" in m
                   for m in said(app))
        assert not any("log_tail" in m or "no such server" in m for m in said(app))


async def test_an_attached_servers_port_column_shows_its_urls_port() -> None:
    recorded = replace(EXT, port=None)  # a recording from before the sample carried it
    app = GpudashApp(FixedFeed([with_servers(sim_snapshot(tick=0), recorded)], specs={**SPECS, "ext": EXT_SPEC}))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("3")
        await pilot.pause(0.1)
        table = app.query_one("#servers-table")
        row = next(table.get_row_at(r) for r in range(table.row_count) if str(table.get_row_at(r)[0]) == "ext")
        assert 9090 in row or "9090" in [str(c) for c in row], row


async def test_a_then_w_keeps_a_found_server_under_its_address_and_says_the_demo_goes(tmp_path: Path) -> None:
    """README: "try it with A, keep it with W". After A the row is attached (the next tick says so); W was
    refused then ("select a found server first")."""
    from gpudash.runtime.control import Controller
    from gpudash.telemetry.inbox import Inbox

    found, inbox = FOUND[0], Inbox()
    feed = FixedFeed([with_servers(sim_snapshot(tick=0), found)], specs=dict(SPECS),
                     controller=Controller(supervisor=(sup := _Attaching()), inbox=inbox))
    config = tmp_path / "gpudash.toml"
    config.write_text('[sampling]\ninterval_s = 1.0\n')
    app = GpudashApp(feed, config_path=config)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("3")
        view = app.query_one("#servers-view")
        view.selected_server = found.server
        view.show(app.state)
        await pilot.press("A")
        await wait_for(pilot, lambda: sup.attached, what="the attach")
        attached = replace(found, state="ready", origin="attached", answers=None)  # the next tick, with A's event
        app.state.ingest(replace(with_servers(sim_snapshot(tick=1), attached), events=tuple(inbox.poll()["events"])))
        view.show(app.state)
        assert view.offers("write_found") and not view.offers("server")
        await pilot.press("W")
        await wait_for(pilot, lambda: "servers" in tomllib.loads(config.read_text()), what="the entry written")
        await wait_for(pilot, lambda: any(m.startswith("wrote [[servers]]") for m in said(app)), what="the note")
    assert tomllib.loads(config.read_text())["servers"] == [
        {"name": "127.0.0.1:8080", "kind": "llama.cpp", "url": "http://127.0.0.1:8080"}]
    assert any("the next launch reads it and so starts no demo" in m for m in said(app))


async def test_latency_at_80x24_with_five_servers_keeps_its_plots() -> None:
    snap = with_servers(sim_snapshot(tick=0), EXT, *FOUND)
    app = GpudashApp(FixedFeed([snap], specs={**SPECS, "ext": EXT_SPEC}))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("4")
        await pilot.pause(0.3)
        own = str(app.query_one("#server-own", Static).content)
        assert "—/—/—" not in own and own.count("127.0.0.1:808") == 3  # the found ones, named on one line
        assert "over the last minute" in own and "prefix-cache hits 75%" in own  # the minute's, not 65% since start
        assert "prefill busy 12% of the time" in own and "prefill/request" not in own
        ttft, hit = app.query_one("#ttft-plot"), app.query_one("#hit-plot")
        assert ttft.size.height >= 6 and hit.size.height >= 6, (ttft.size, hit.size, own)


async def test_servers_with_nothing_configured_and_no_demo_promise_no_launcher() -> None:
    app = GpudashApp(FixedFeed([replace(sim_snapshot(tick=0), servers=())], specs={}))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("3")
        await pilot.pause(0.1)
        empty = str(app.query_one("#servers-view").query_one(".empty", Static).content)
        assert "one after another" not in empty and "none is configured and the demo is off" in empty


async def test_the_rate_says_its_window_and_that_it_lags_a_load_change() -> None:
    """Issue 43 item 5: "tok/s 10s" lagged load changes by up to 58% for a window, mostly because the server
    refreshes between batches; the selected server's detail says so."""
    ext = replace(EXT, tokens_per_s=31.0, rate_window_s=10.2)
    app = GpudashApp(FixedFeed([with_servers(sim_snapshot(tick=0), ext)], specs={**SPECS, "ext": EXT_SPEC}))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("3")
        view = app.query_one("#servers-view")
        view.selected_server = "ext"
        view.show(app.state)
        await pilot.pause(0.1)
        detail = str(app.query_one("#server-detail", Static).content)
        assert "tok/s over the last 10 s" in detail and "lags a change of load by up to a batch" in detail
        assert "31.0" in table_text(view)  # the sample's own windowed rate
