"""A change's Events entry of J/token before and after: the same window each side, begun once a relaunched
server is back under a new process, and "not enough traffic to compare" where a side has too few tokens."""

from __future__ import annotations

from gpudash.advisor.energy_compare import Side, side, verdict
from gpudash.records import Event, ServerEnergySample, ServerSample, Snapshot
from gpudash.runtime.energy_watch import EnergyComparisons


def test_side_and_verdict() -> None:
    samples = [(0.0, 0.0, 0.0), (10.0, 50.0, 100.0), (20.0, 100.0, 200.0), (30.0, 300.0, 300.0)]
    assert side(samples, 0.0, 20.0) == Side(100.0, 200.0, 20.0)
    assert side(samples, 25.0, 40.0) is None  # one sample: no change to tell
    b, a, why = verdict(Side(100.0, 200.0, 20.0), Side(150.0, 200.0, 20.0), 20.0, min_tokens=100)
    assert (b, a) == (0.5, 0.75) and why == "J/token 0.5 -> 0.75 (+50%), 20 s each side, 200 and 200 tokens"
    b, a, why = verdict(Side(100.0, 200.0, 20.0), Side(10.0, 20.0, 20.0), 20.0, min_tokens=100)
    assert (b, a) == (None, None) and why.startswith("not enough traffic to compare")
    assert "before 200, after 20" in why


def _tick(t: float, pid: int | None, state: str, joules: float, tokens: float,
          events: tuple[Event, ...] = ()) -> Snapshot:
    energy = (ServerEnergySample(t, "a", "0", "whole_gpu", busy_j=joules, generation_tokens=tokens),) if pid else ()
    return Snapshot(t, int(t), "sim:h200", servers=(ServerSample(t, "a", "llama.cpp", state, pid),),
                    server_energy=energy, events=events)


def test_a_split_is_followed_by_j_per_token_before_and_after_the_relaunch() -> None:
    watch = EnergyComparisons(window_s=10.0, min_tokens=50)
    out = []
    # before: 2 J/token (20 J and 10 tokens a second)
    for t in range(0, 21):
        change = (Event(20.0, "keyboard", "server.split", "a", [1, 1], [2, 1]),) if t == 20 else ()
        out.append(watch(_tick(float(t), 100, "ready", 20.0 * t, 10.0 * t, change)))
    for t in range(21, 25):  # the old process still shows, then relaunching: none of this is "after"
        out.append(watch(_tick(float(t), 100 if t < 22 else None, "ready" if t < 22 else "relaunching",
                               20.0 * t, 10.0 * t)))
    for t in range(25, 40):  # back under pid 200: 1 J/token
        out.append(watch(_tick(float(t), 200, "ready", 480.0 + 10.0 * (t - 25), 240.0 + 10.0 * (t - 25))))
    added = [e for r in out for e in r.get("events", ()) if e.kind == "server.split.energy"]
    assert len(added) == 1
    (e,) = added
    assert (e.target, e.old, e.new, e.ts) == ("a", 2.0, 1.0, 35.0)
    assert e.reason.startswith("J/token 2 -> 1 (-50%), 10 s each side, 100 and 100 tokens")
    assert [r for r in out if r and not r.get("events")] == []  # only the tick that adds one returns fields


def test_an_engine_knob_without_traffic_says_so() -> None:
    watch = EnergyComparisons(window_s=10.0, min_tokens=50)
    added = []
    for t in range(0, 30):
        change = (Event(15.0, "keyboard", "engine.knobs", "engine", {"outstanding": 2}, {"outstanding": 4}),) \
            if t == 15 else ()
        added += watch(_tick(float(t), 100, "ready", 20.0 * t, 1.0 * t, change)).get("events", ())
    (e,) = [e for e in added if e.kind == "engine.knobs.energy"]
    assert e.old is None and e.new is None and e.reason.startswith("not enough traffic to compare")
