"""A knob the operator changes reaches every preloaded process's knob block, validated first; each
process's answer (applied, refused) is an event."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpudash.preload import shm as P
from gpudash.runtime.control import Controller, SetEngineKnobs
from gpudash.preload.knobs import PreloadKnobs
from gpudash.telemetry.inbox import Inbox
from preload_helpers import wait_for_block


@pytest.fixture
def sim_engine():
    from gpudash.engine import EngineConfig, TransferEngine

    eng = TransferEngine(EngineConfig(backend="sim", profile="h200"))
    yield eng
    eng.close()


def _preload_events(inbox: Inbox, pid: int) -> list:
    return [e for e in inbox.poll().get("events", ()) if e.kind == "preload.knobs" and f"(pid {pid})" in e.target]


def test_a_live_knob_reaches_the_process_and_is_applied(process_side, sim_engine) -> None:
    ps = process_side("block-name")
    inbox = Inbox()
    c = Controller(engine=sim_engine, inbox=inbox, preload=PreloadKnobs(inbox, lambda: {ps.pid: "big"}, wait_s=30.0))
    result = c.apply(SetEngineKnobs({"h2d_chunk_bytes": "4MiB", "registration_cache_bytes": 2**30}))
    assert result.ok, result.reason
    with P.StatsView(ps.pid) as view:
        s = view.read()
    assert s.knobs_generation == 1
    assert s.knobs["h2d_chunk_bytes"] == 4 * 2**20
    assert s.knobs["staging_threads"] == 4 and s.knobs["h2d_staging_bytes"] == 16 * 2**20  # its own, kept
    (event,) = _preload_events(inbox, ps.pid)
    assert event.ok and event.target == f"big (pid {ps.pid})"
    assert event.old == {"h2d_chunk_bytes": 2_810_000} and event.new == {"h2d_chunk_bytes": 4 * 2**20}


def test_a_refusal_by_the_process_is_an_event(process_side, sim_engine) -> None:
    ps = process_side("big")
    assert ps.cmd("refuse 1") == "ok"
    inbox = Inbox()
    c = Controller(engine=sim_engine, inbox=inbox, preload=PreloadKnobs(inbox, lambda: {ps.pid: "big"}, wait_s=30.0))
    assert c.apply(SetEngineKnobs({"outstanding": 4})).ok  # gpudash's own engine took it
    (event,) = _preload_events(inbox, ps.pid)
    assert not event.ok and "refused knob generation 1" in event.reason
    with P.StatsView(ps.pid) as view:
        assert view.read().knobs["outstanding"] == 2


def test_a_bad_knob_reaches_no_process(process_side, sim_engine) -> None:
    ps = process_side("big")
    inbox = Inbox()
    c = Controller(engine=sim_engine, inbox=inbox, preload=PreloadKnobs(inbox, lambda: {ps.pid: "big"}, wait_s=30.0))
    assert not c.apply(SetEngineKnobs({"staging_threads": 0})).ok
    assert not _preload_events(inbox, ps.pid)
    with P.KnobBlock(ps.pid) as kb:
        assert kb.read().generation == 0


def test_knobs_reach_only_the_supervised_servers(process_side) -> None:
    served, other = process_side("big"), process_side("run-program")
    inbox = Inbox()
    PreloadKnobs(inbox, lambda: {served.pid: "big"}, wait_s=30.0).apply({"outstanding": 3})
    with P.KnobBlock(served.pid) as a, P.KnobBlock(other.pid) as b:
        assert (a.read().generation, b.read().generation) == (1, 0)


def test_a_process_that_passes_everything_through_gets_no_knobs(stub_preload) -> None:
    env = {**os.environ, "LD_PRELOAD": str(stub_preload), "GPUDASH_PRELOAD": "off", P.NAME_ENV: "offline"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env)
    try:
        wait_for_block(child.pid)
        inbox = Inbox()
        events = PreloadKnobs(inbox, lambda: {child.pid: "offline"}, wait_s=30.0).apply({"outstanding": 3})
        (mine,) = events
        assert not mine.ok and "passes every copy through (state off)" in mine.reason
    finally:
        child.stdin.close()
        child.wait(timeout=30)
