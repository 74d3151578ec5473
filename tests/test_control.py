"""Controller.apply against the real pieces: a real llama-server under the real Supervisor, the real
sim-backend TransferEngine, the real Inbox. Every change is validated first, applied, and recorded as an
event with old and new values; a refused change leaves everything as it was."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudash.config import ServerSpec
from gpudash.runtime.control import (AttachServer, Controller, ServerAction, SetEngineKnobs, SetRecording, SetShardSize,
                             SetShare, SetSplit, SignalProcess, describe, relaunches)
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox

@pytest.fixture
def rig(tiny_model: Path, tmp_path: Path):
    """Two real llama-servers sharing GPU 1 (on CPU here), supervised; stopped after the test."""
    inbox = Inbox()
    specs = [ServerSpec(name="big", model=str(tiny_model), gpus=[0, 1], tensor_split=[1, 1], share=0.5, ctx_size=512,
                        health_timeout_s=30),
             ServerSpec(name="side", model=str(tiny_model), gpus=[1], share=0.4, ctx_size=512, health_timeout_s=30)]
    sup = Supervisor(specs, inbox, tmp_path / "logs")
    sup.start_all()
    try:
        yield sup, inbox
    finally:
        sup.stop_all()


def events(inbox: Inbox, actor: str = "keyboard") -> list:
    return [e for e in inbox.poll()["events"] if e.actor == actor]


def pid_of(sup: Supervisor, name: str) -> int | None:
    return next(s.pid for s in sup.states() if s.server == name)


def test_split_change_relaunches_and_records_old_and_new(rig) -> None:
    sup, inbox = rig
    before = pid_of(sup, "big")
    res = Controller(supervisor=sup, inbox=inbox).apply(SetSplit("big", (2.0, 3.0)))
    assert res.ok, res.reason
    assert sup.specs()["big"].tensor_split == [2.0, 3.0]
    assert pid_of(sup, "big") != before  # a new process: the server was re-launched
    assert next(s.state for s in sup.states() if s.server == "big") == "ready"
    drained = inbox.poll()["events"]
    mine = [e for e in drained if e.actor == "keyboard"]
    assert [(e.kind, e.target, e.old, e.new, e.ok) for e in mine] == [
        ("server.split", "big", [1.0, 1.0], [2.0, 3.0], True)]
    assert any(e.kind == "server.restart" and e.target == "big" for e in drained)


@pytest.mark.parametrize("command, reason", [
    (SetSplit("big", (1.0, 2.0, 3.0)), "give 2 ratios, not 3"),
    (SetSplit("nope", (1.0, 1.0)), "no server named 'nope'"),
    (SetSplit("big", (-1.0, 2.0)), "tensor_split must be non-negative"),
    (SetShare("side", 0.6), "GPU 1: shares add up to"),
    (SetShare("big", 1.5), "memory share 1.5 is outside (0, 1]"),
    (ServerAction("big", "explode"), "unknown server action"),  # type: ignore[arg-type]
])
def test_refused_changes_leave_everything_as_it_was(rig, command, reason: str) -> None:
    sup, inbox = rig
    specs, pids = sup.specs(), {s.server: s.pid for s in sup.states()}
    inbox.poll()
    res = Controller(supervisor=sup, inbox=inbox).apply(command)
    assert not res.ok and reason in res.reason
    assert sup.specs() == specs and {s.server: s.pid for s in sup.states()} == pids
    [ev] = events(inbox)
    assert ev.ok is False and reason in ev.reason


def test_server_stop_and_start_are_recorded(rig) -> None:
    sup, inbox = rig
    c = Controller(supervisor=sup, inbox=inbox)
    assert c.apply(ServerAction("side", "stop")).ok
    assert next(s.state for s in sup.states() if s.server == "side") == "stopped"
    assert c.apply(ServerAction("side", "start")).ok
    mine = events(inbox)
    assert [(e.kind, e.old, e.new) for e in mine] == [("server.stop.request", "ready", "stopped"),
                                                      ("server.start.request", "stopped", "ready")]


def test_engine_knobs_apply_live_on_the_sim_engine() -> None:
    from gpudash.engine import EngineConfig, TransferEngine

    eng = TransferEngine(EngineConfig(backend="sim", profile="rtx5080+rtx3090"))
    inbox = Inbox()
    try:
        c = Controller(engine=eng, inbox=inbox)
        old = eng.knobs()["h2d_chunk_bytes"]
        res = c.apply(SetEngineKnobs({"h2d_chunk_bytes": "4MiB", "outstanding": 3}))
        assert res.ok, res.reason
        assert eng.knobs()["h2d_chunk_bytes"] == 4 * 2**20 and eng.stats().knobs["outstanding"] == 3
        assert res.event.old == {"h2d_chunk_bytes": old, "outstanding": 2}
        assert res.event.new == {"h2d_chunk_bytes": 4 * 2**20, "outstanding": 3}
        knobs = eng.knobs()
        bad = c.apply(SetEngineKnobs({"h2d_chunk_bytes": "8MiB", "outstanding": 0}))
        assert not bad.ok and "outstanding" in bad.reason
        tiny = c.apply(SetEngineKnobs({"h2d_chunk_bytes": 100}))
        assert tiny.reason.endswith("got 100 B") and "between 4 KiB and 1 GiB" in tiny.reason
        assert eng.knobs() == knobs  # nothing half-applied: the valid chunk size did not land either
        assert not c.apply(SetEngineKnobs({"warp_speed": 9})).ok
        assert [e.ok for e in events(inbox)] == [True, False, False, False]
    finally:
        eng.close()


class FlagRecorder:
    def __init__(self) -> None:
        self.on = True

    def set(self, on: bool) -> None:
        self.on = on


def test_missing_parts_are_refused_with_a_reason() -> None:
    c = Controller()
    assert "no transfer engine" in c.apply(SetEngineKnobs({"outstanding": 3})).reason
    assert "no servers" in c.apply(SetSplit("big", (1.0, 1.0))).reason
    assert "not available" in c.apply(SetRecording(False)).reason
    rec = FlagRecorder()
    res = Controller(recorder=rec).apply(SetRecording(False))
    assert res.ok and (res.event.old, res.event.new) == (True, False) and rec.on is False


def test_relaunching_commands_are_flagged_for_confirmation() -> None:
    assert relaunches(SetSplit("a", (1.0, 2.0))) and relaunches(SetShare("a", 0.5))
    assert not relaunches(SetEngineKnobs({"outstanding": 2})) and not relaunches(SetRecording(True))
    assert "re-launches a" in describe(SetSplit("a", (1.0, 2.0)))


def test_shard_resize_goes_through_the_pool_and_refusals_change_nothing() -> None:
    from gpudash.engine.pools import MemoryPool

    pool = MemoryPool(8 * 2**20, name="host", shards={"kv": 2 * 2**20, "staging": 2 * 2**20})
    inbox = Inbox()
    try:
        c = Controller(pools=lambda: {"host": pool}, inbox=inbox)
        res = c.apply(SetShardSize("host", "kv", "3MiB"))
        assert res.ok, res.reason
        assert pool.shard_stats("kv").capacity == 3 * 2**20
        assert (res.event.kind, res.event.target, res.event.old, res.event.new) == (
            "pool.shard_size", "host/kv", 2 * 2**20, 3 * 2**20)
        too_big = c.apply(SetShardSize("host", "kv", "64MiB"))
        assert not too_big.ok and "unassigned" in too_big.reason
        assert "from 3.0 MiB to 64.0 MiB: only 3.0 MiB of the slab" in too_big.reason  # sizes people read
        assert pool.shard_stats("kv").capacity == 3 * 2**20
        assert "no shard 'nope'" in c.apply(SetShardSize("host", "nope", 4096)).reason
        assert "no memory pool named 'gpu9'" in c.apply(SetShardSize("gpu9", "kv", 4096)).reason
        assert "shard size" in c.apply(SetShardSize("host", "kv", "lots")).reason
        block = pool.alloc("staging", 2**20 + 12345)  # live bytes past 1 MiB: staging cannot shrink to 1 MiB
        busy = c.apply(SetShardSize("host", "staging", "1MiB"))
        assert "from 2.0 MiB to 1.0 MiB" in busy.reason and busy.event.reason == busy.reason
        need = int(re.search(r"shrink to at least \d+\.\d (?:KiB|MiB) \((\d+) bytes\)$", busy.reason)[1])
        assert need >= 2**20 + 12345  # a limit that rounds keeps its exact bytes, so it can be met
        assert c.apply(SetShardSize("host", "staging", need)).ok
        pool.free(block)
        assert [e.ok for e in events(inbox)] == [True, False, False, False, False, False, True]
    finally:
        pool.close()


def test_refused_events_carry_the_value_that_stayed(rig) -> None:
    sup, inbox = rig
    res = Controller(supervisor=sup, inbox=inbox).apply(SetShare("big", 0.7))  # GPU 1: 0.7 + side's 0.4 > 1
    assert not res.ok and (res.event.old, res.event.new) == (0.5, 0.7)


def test_each_command_carries_its_description_event_and_relaunch_flag() -> None:
    from gpudash.runtime.control import Command, ControlCommand

    cases = [
        (SetEngineKnobs({"outstanding": 3}), "set engine outstanding=3", ("engine.knobs", "engine", {"outstanding": 3}),
         False),
        (SetSplit("big", (2.0, 3.0)), "set big tensor split to 2,3 (re-launches big)",
         ("server.split", "big", [2.0, 3.0]), True),
        (SetShare("big", 0.5), "set big memory share to 0.5 (re-launches big)", ("server.share", "big", 0.5), True),
        (SetShardSize("p", "kv", "1MiB"), "resize shard kv of pool p to 1MiB", ("pool.shard_size", "p/kv", "1MiB"),
         False),
        (ServerAction("big", "start"), "start big", ("server.start.request", "big", "start"), False),
        (ServerAction("big", "stop"), "stop big", ("server.stop.request", "big", "stop"), True),
        (SetRecording(False), "turn recording off", ("recording", "store", False), False),
        (SignalProcess(123, "TERM"), "send SIGTERM to pid 123", ("process.signal", "pid 123", "SIGTERM"), False),
        (AttachServer("llamacpp-7", "llama.cpp", "http://127.0.0.1:8080"),
         "attach llamacpp-7 (llama.cpp at http://127.0.0.1:8080) for this run",
         ("server.attach", "llamacpp-7", {"kind": "llama.cpp", "url": "http://127.0.0.1:8080"}), False),
    ]
    assert {type(c) for c, *_ in cases} == set(Command.__args__)
    for command, text, event, relaunch in cases:
        assert isinstance(command, ControlCommand)
        assert (describe(command), command.event(), relaunches(command)) == (text, event, relaunch)
    with pytest.raises(TypeError, match="not a control command"):
        Controller().apply("outstanding=3")  # type: ignore[arg-type]
