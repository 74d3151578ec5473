"""The live path of a change's J/token before and after: a real llama-server run by gpudash's Run on the sim
rig under load, an engine-knob change applied through the Controller as the keyboard does, and the
`engine.knobs.energy` entry that follows it in the snapshots' events (the windows shortened to 3 s)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from energy_helpers import keep_generating

from gpudash.config import Config
from gpudash.records import Snapshot
from gpudash.runtime import energy_watch
from gpudash.runtime.control import SetEngineKnobs
from gpudash.runtime.run import Run


def _wait_for_a_window_of_traffic(snaps: list[Snapshot], deadline_s: float = 60.0) -> None:
    """Until the meter has counted twice MIN_TOKENS over the last WINDOW_S (a loaded 2-core box may take
    longer than a window to get the first tokens out of a server that has just become ready)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        counted = [(s.ts, e.generation_tokens) for s in list(snaps) for e in s.server_energy if e.server == "tiny"]
        if counted:
            ts, now = counted[-1]
            before = [g for t, g in counted if t <= ts - energy_watch.WINDOW_S]
            if before and now - before[-1] >= 2 * energy_watch.MIN_TOKENS:
                return
        time.sleep(0.25)
    raise AssertionError(f"the server generated too little within {deadline_s} s to compare")


@pytest.mark.llama
def test_an_engine_knob_change_is_followed_by_j_per_token_before_and_after(
        tmp_path: Path, tiny_model: Path, llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(energy_watch, "WINDOW_S", 3.0)
    monkeypatch.setattr(energy_watch, "MIN_TOKENS", 20.0)
    config = Config.model_validate({
        "probe": {"enabled": False}, "sampling": {"interval_s": 0.25},
        "servers": [{"name": "tiny", "model": str(tiny_model), "binary": llama_server, "ctx_size": 512}]})
    snaps: list[Snapshot] = []
    run = Run(config, "sim:h200", tmp_path / "g.db", servers=True, log_dir=tmp_path / "logs")
    stop = threading.Event()
    try:
        run.start([snaps.append])
        run.start_servers()
        url = run.stack.supervisor.base_url("tiny")

        keep_generating(url, stop)
        _wait_for_a_window_of_traffic(snaps)  # the comparison needs MIN_TOKENS in the window before the change
        assert run.controller is not None
        assert run.controller.apply(SetEngineKnobs({"outstanding": 3})).ok
        deadline = time.monotonic() + 30
        found = []
        while not found and time.monotonic() < deadline:
            found = [e for s in list(snaps) for e in s.events if e.kind == "engine.knobs.energy"]
            time.sleep(0.25)
    finally:
        stop.set()
        run.close()
    assert found, "no J/token comparison followed the change"
    (e,) = found
    assert e.target == "engine" and e.ok and e.old > 0 and e.new > 0, e
    assert e.reason.startswith("J/token ") and "3 s each side" in e.reason, e.reason
