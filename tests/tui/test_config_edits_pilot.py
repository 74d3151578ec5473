"""At 80x24, the two keys that write the user's config file (config/edit.py) on the live simulated rig: the
knob form's `w` edits the file in place (comments, order and mode kept), and a llama-server running on the
CPU outside gpudash, found by its command line on a rig whose GPUs run no real process, is written with `W`
and attached with `A`. Real processes: the live feed's engine and a real llama-server."""

from __future__ import annotations

import stat
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from tui_helpers import wait_for

from gpudash.config import Config
from gpudash.launcher.health import free_port, wait_healthy
from gpudash.runtime.feed import LiveFeed
from gpudash.tui.app import GpudashApp
from gpudash.tui.screens.forms import KnobForm
from gpudash.tui.widgets.servers import ServersView

SIZE = (80, 24)
pytestmark = pytest.mark.anyio


def _feed(tmp_path: Path) -> LiveFeed:
    """A live simulated rig with one attached server (so no demo is started) and no probe."""
    cfg = Config.model_validate({"sampling": {"interval_s": 0.25}, "probe": {"enabled": False},
                                 "store": {"flush_interval_s": 0.2}, "sim": {"profile": "h200", "load": "off"},
                                 "servers": [{"name": "far", "url": "http://127.0.0.1:9"}]})
    return LiveFeed(cfg, "sim:h200", tmp_path / "gpudash.db", record=True, log_dir=tmp_path / "logs")


@pytest.fixture
def llama_on_the_cpu(llama_server: str, tiny_model: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([llama_server, "-m", str(tiny_model), "--host", "127.0.0.1", "--port", str(port),
                             "-c", "512", "-np", "1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(proc, f"{url}/health", 60.0)
        yield proc, url
    finally:
        proc.kill()
        proc.wait()


async def test_w_saves_knobs_into_the_users_file_in_place(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    mine = "# my box\n[sampling]\ninterval_s = 0.25  # fast\n\n[engine]  # by hand\nstaging_threads = 4  # four\n"
    cfg.write_text(mine)
    cfg.chmod(0o640)
    feed = _feed(tmp_path)
    app = GpudashApp(feed, config_path=cfg)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.info is not None and app.state.latest is not None, what="the live feed")
            await pilot.press("5", "k")
            assert isinstance(app.screen, KnobForm)
            await pilot.press("ctrl+a", "ctrl+k", *"4MiB", "enter")  # first field: h2d_chunk_bytes
            await wait_for(pilot, lambda: any(e.kind == "engine.knobs" and e.ok for e in app.state.events),
                           what="the knob change")
            await pilot.press("w")
            await wait_for(pilot, lambda: "h2d_chunk_bytes" in cfg.read_text(), what="the knobs saved")
    finally:
        feed.close()
    assert cfg.read_text() == mine + f"h2d_chunk_bytes = {4 << 20}\n"  # every comment, in its place
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".config", "config"))) == ["config.toml"]


@pytest.mark.llama
async def test_a_server_on_the_cpu_is_found_written_and_attached(llama_on_the_cpu, tmp_path: Path) -> None:
    proc, url = llama_on_the_cpu
    name = url.removeprefix("http://")  # host:port: a found server's name
    cfg = tmp_path / "config.toml"
    cfg.write_text("# mine\n")
    feed = _feed(tmp_path)
    app = GpudashApp(feed, config_path=cfg)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.state.latest is not None
                           and any(s.server == name for s in app.state.latest.servers), timeout=60,
                           what="the server found by its command line")
            await pilot.press("3")
            view = app.query_one(ServersView)
            for _ in range(len(app.state.latest.servers)):
                if view.selected_server == name:
                    break
                await pilot.press("down")
            assert view.selected_server == name
            await pilot.press("W")  # first: once attached, the row is no longer a found one
            await wait_for(pilot, lambda: "servers" in tomllib.loads(cfg.read_text()), what="the entry written")
            await pilot.press("A")
            await wait_for(pilot, lambda: any(e.kind == "server.attach" and e.ok for e in app.state.events),
                           what="the attach")
            await wait_for(pilot, lambda: any(s.server == name and s.origin == "attached"
                                              for s in app.state.latest.servers), what="the server read as attached")
    finally:
        feed.close()
    assert cfg.read_text().startswith("# mine\n")
    assert tomllib.loads(cfg.read_text())["servers"] == [{"name": name, "kind": "llama.cpp", "url": url}]
