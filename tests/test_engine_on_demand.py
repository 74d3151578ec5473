"""Watching real GPUs holds no GPU memory: a live run's transfer engine (on real GPUs, a CUDA context of
about 520 MiB) is made on first need: a knob change, the Engine or Pools view opened, pools written in the
config file. No GPU here, so the "real" rig is NvmlRig with its engine and GPU source taken from the sim
(the sim engine stands in for CUDA, counted each time one is made); everything else is the real run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.runtime.control import SetEngineKnobs
from gpudash.runtime.run import Run
from gpudash.telemetry.rig import NvmlRig, SimulatedRig


class CountingRig(NvmlRig):
    """NvmlRig whose engine is a sim engine (counted) and whose GPUs are a sim rig's."""

    def __init__(self) -> None:
        object.__setattr__(self, "made", [])

    def make_engine(self, config: Config):  # type: ignore[override]
        engine = SimulatedRig("h200").make_engine(config)
        self.made.append(engine)
        return engine

    def gpu_source(self, config, engine, pids):  # type: ignore[override]
        return SimulatedRig("h200").gpu_source(config, None, pids)

    def gpu_memory_totals(self) -> dict[int, int]:
        return {}


def _run(tmp_path: Path, config: Config) -> tuple[Run, CountingRig, list]:
    rig = CountingRig()
    snaps: list = []
    run = Run(config, rig, tmp_path / "g.db", live_engine=True, pools=True)
    run.start([snaps.append], interval_s=0.05, record=False)
    return run, rig, snaps


def _wait(cond, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_watching_makes_no_engine_until_a_knob_changes(tmp_path: Path) -> None:
    run, rig, snaps = _run(tmp_path, Config())
    try:
        _wait(lambda: len(snaps) >= 5, "five ticks")
        assert rig.made == []  # five ticks of watching, no engine
        assert all(s.engine_paths == () and s.pools == () for s in snaps)
        controller = run.controller
        assert controller.knobs()["outstanding"] == Config().engine.outstanding  # the config's, unstarted
        result = controller.apply(SetEngineKnobs({"outstanding": 3}))
        assert result.ok, result.reason
        assert len(rig.made) == 1 and rig.made[0].knobs()["outstanding"] == 3
        _wait(lambda: snaps[-1].engine_paths and snaps[-1].pools, "the engine's paths and the default pools")
        run.session.want_engine()
        assert len(rig.made) == 1  # made once
    finally:
        run.close()
    assert rig.made[0].closed


def test_pools_written_in_the_config_start_the_engine_at_once(tmp_path: Path) -> None:
    config = Config.model_validate({"pools": {"host_bytes": "8MiB", "device_bytes": "2MiB"}})
    run, rig, _ = _run(tmp_path, config)
    try:
        assert len(rig.made) == 1 and run.session.pools
    finally:
        run.close()


def test_an_engine_that_cannot_start_is_one_note(tmp_path: Path) -> None:
    class Broken(CountingRig):
        def make_engine(self, config: Config):  # type: ignore[override]
            self.made.append(None)
            raise RuntimeError("no driver here")

    rig = Broken()
    run = Run(Config(), rig, tmp_path / "g.db", live_engine=True, pools=True)
    run.start([], interval_s=0.05, record=False)
    try:
        assert run.notes == []
        run.session.want_engine()
        run.session.want_engine()  # not tried again
        assert rig.made == [None] and run.session.notes == ["transfer engine unavailable: no driver here"]
        refused = run.controller.apply(SetEngineKnobs({"outstanding": 3}))
        assert not refused.ok and "no driver here" in refused.reason
    finally:
        run.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_opening_the_pools_view_starts_the_engine(tmp_path: Path) -> None:
    from gpudash.runtime.feed import LiveFeed
    from gpudash.tui.app import GpudashApp

    rig = CountingRig()
    config = Config.model_validate({"sampling": {"interval_s": 0.1}, "probe": {"enabled": False},
                                    "servers": [{"name": "far", "kind": "llama.cpp", "url": "http://127.0.0.1:9"}]})
    feed = LiveFeed(config, rig, tmp_path / "g.db", record=False, log_dir=tmp_path / "logs")
    app = GpudashApp(feed)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            async def until(cond, what: str) -> None:
                deadline = time.monotonic() + 20
                while not cond():
                    assert time.monotonic() < deadline, f"timed out waiting for {what}"
                    await pilot.pause(0.1)

            await until(lambda: app.state.latest is not None and app.info is not None, "the first tick")
            await pilot.press("2")  # another view: still no engine
            await pilot.pause(0.5)
            assert rig.made == []
            app.action_show_view("pools")
            await until(lambda: rig.made, "the engine")
            await until(lambda: app.state.latest.pools, "the pools in a tick")
            await pilot.press("q")
    finally:
        feed.close()
