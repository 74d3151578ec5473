"""On a real NVIDIA GPU (run with -m gpu on the H200): the dashboard on NVML and the CUDA engine backend,
labelled as real GPUs, one card per device, and a knob edit reaching the CUDA engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_helpers import wait_for

from gpudash.config import Config
from gpudash.tui.app import GpudashApp
from gpudash.runtime.feed import LiveFeed
from gpudash.tui.widgets.overview import GpuCard

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


async def test_live_dashboard_on_real_gpus(tmp_path: Path) -> None:
    import pynvml

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    cfg = Config.model_validate({"sampling": {"interval_s": 0.25}, "probe": {"enabled": False}})
    feed = LiveFeed(cfg, "nvml", tmp_path / "gpu.db", record=True, log_dir=tmp_path / "logs")
    app = GpudashApp(feed)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.state.latest is not None and app.info is not None, timeout=60,
                           what="the first NVML snapshot")
            assert app.header.source == "nvml" and not app.state.latest.is_sim
            assert len(app.state.latest.gpus) == count
            assert len(app.query(".gpu-card")) == count
            assert "SIM" not in app.query_one("#gpu-0", GpuCard).lines[0].plain
            await pilot.press("5", "k", "ctrl+a", "ctrl+k", *"4MiB", "enter")
            await wait_for(pilot, lambda: any(e.kind == "engine.knobs" and e.ok for e in app.state.events),
                           what="the engine.knobs event")
            assert feed.engine.knobs()["h2d_chunk_bytes"] == 4 * 2**20
            await pilot.press("q")
    finally:
        feed.close()
