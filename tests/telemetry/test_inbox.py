"""The inbox: thread-safe pushes, drained into the snapshot by each tick."""

from __future__ import annotations

import threading

import pytest

from gpudash.records import Event, RequestSample
from gpudash.telemetry.inbox import Inbox
from gpudash.telemetry.sampler import Sampler


def _event(i: int) -> Event:
    return Event(ts=float(i), actor="test", kind="engine.knob", target="outstanding", old=i, new=i + 1)


def _request(i: int) -> RequestSample:
    return RequestSample(ts=float(i), server="s", ttft_s=0.01, total_s=0.1, prompt_tokens=10, cached_tokens=i % 10)


def test_concurrent_pushes_are_drained_once_in_order() -> None:
    inbox = Inbox()
    threads = [threading.Thread(target=lambda k=k: [inbox.push(_event(k * 1000 + i)) for i in range(500)])
               for k in range(4)]
    for t in threads:
        t.start()
    for i in range(100):
        inbox.push(_request(i))
    for t in threads:
        t.join()
    out = inbox.poll()
    assert len(out["events"]) == 2000 and len(out["requests"]) == 100
    for k in range(4):
        mine = [e.old for e in out["events"] if e.old // 1000 == k]
        assert mine == sorted(mine)
    assert inbox.poll() == {"events": (), "requests": ()} and len(inbox) == 0


def test_push_rejects_other_records() -> None:
    with pytest.raises(TypeError, match="Event or a RequestSample"):
        Inbox().push({"kind": "x"})  # type: ignore[arg-type]


def test_overflow_keeps_newest_and_says_so() -> None:
    inbox = Inbox(maxlen=10)
    for i in range(15):
        inbox.push(_event(i))
    out = inbox.poll()
    assert [e.old for e in out["events"]] == list(range(5, 15))
    assert out["errors"] == ("inbox: 5 records dropped because nothing drained the inbox",)


def test_sampler_puts_inbox_records_into_the_tick() -> None:
    inbox = Inbox()
    s = Sampler([inbox], interval_s=1, source_label="sim:h200")
    inbox.push(_event(1))
    inbox.push(_request(2))
    snap = s.poll_once()
    assert snap.events == (_event(1),) and snap.requests == (_request(2),)
    assert s.poll_once().events == ()
    s.stop()
