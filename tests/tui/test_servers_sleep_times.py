"""The Servers view's line of sleep/wake timings, from the supervisor's server.sleep / server.wake events."""

from __future__ import annotations

from gpudash.records import Event
from gpudash.tui.widgets.servers import _sleep_times


def test_latest_timing_per_server_and_kind() -> None:
    def ev(kind: str, target: str, seconds: float, ok: bool = True) -> Event:
        return Event(ts=seconds, actor="supervisor", kind=kind, target=target, old="ready",
                     new={"state": "sleeping", "seconds": seconds, "level": 1}, ok=ok)

    events = [ev("server.sleep", "a", 0.5), ev("server.wake", "a", 2.48), ev("server.wake", "a", 1.25),
              ev("server.sleep", "b", 9.0, ok=False), ev("server.start", "b", 1.0)]
    assert _sleep_times(events) == "sleep/wake: a slept in 0.50 s, a woke in 1.25 s"
    assert _sleep_times([]) == ""
