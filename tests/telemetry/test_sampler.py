"""Sampler scheduling: no overlap, slow and raising sources go NA without hurting the others, sinks."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from gpudash.records import GpuSample, HostSample, Snapshot
from gpudash.telemetry.sampler import Sampler


class GpuStub:
    """A source returning one GpuSample per poll and recording when each poll ran."""

    def __init__(self, name: str = "gpu", sleep_s: float = 0.0) -> None:
        self.name, self.sleep_s = name, sleep_s
        self.spans: list[tuple[float, float]] = []
        self.active = self.max_active = 0
        self.closed = False
        self._lock = threading.Lock()

    def poll(self) -> dict:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        start = time.monotonic()
        time.sleep(self.sleep_s)
        self.spans.append((start, time.monotonic()))
        with self._lock:
            self.active -= 1
        return {"gpus": (GpuSample(ts=time.time(), index=len(self.spans), uuid="u", name=self.name),)}

    def close(self) -> None:
        self.closed = True


class Blocking:
    """A source whose poll blocks until released: a hung driver call."""

    name = "hung"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def poll(self) -> dict:
        self.calls += 1
        self.release.wait(10)
        return {"host": HostSample(ts=time.time(), cpu_pct=1.0)}

    def close(self) -> None:
        self.release.set()


class Raising:
    name = "broken"

    def poll(self) -> dict:
        raise RuntimeError("boom")

    def close(self) -> None:
        pass


def test_ticks_never_overlap_and_follow_the_interval() -> None:
    src = GpuStub(sleep_s=0.02)
    seen: list[Snapshot] = []
    s = Sampler([src], interval_s=0.01, source_label="sim:h200", sinks=[seen.append])
    s.start()
    time.sleep(0.35)
    s.stop()
    assert len(seen) >= 5 and src.max_active == 1
    assert [snap.tick for snap in seen] == list(range(len(seen)))
    # each poll starts only after the previous one ended plus the interval
    for (_, prev_end), (start, _) in zip(src.spans, src.spans[1:]):
        assert start - prev_end >= 0.009
    assert src.closed and all(snap.source == "sim:h200" and snap.is_sim for snap in seen)


def test_slow_source_is_na_and_skipped_while_busy() -> None:
    hung, fast = Blocking(), GpuStub()
    s = Sampler([hung, fast], interval_s=1, source_label="nvml", source_timeout_s=0.05)
    first = s.poll_once()
    assert first.host is None and len(first.gpus) == 1
    assert any("hung: no answer within 0.05 s" in e for e in first.errors)
    second = s.poll_once()
    assert hung.calls == 1 and len(second.gpus) == 1
    assert any("hung: previous poll still running" in e for e in second.errors)
    hung.release.set()
    time.sleep(0.05)
    third = s.poll_once()
    assert hung.calls == 2 and third.host is not None and third.host.cpu_pct == 1.0 and third.errors == ()
    s.stop()


def test_raising_source_reports_error_and_others_go_on() -> None:
    s = Sampler([Raising(), GpuStub()], interval_s=1, source_label="nvml")
    snap = s.poll_once()
    assert len(snap.gpus) == 1 and snap.errors == ("broken: RuntimeError: boom",)
    s.stop()


def test_failing_sink_does_not_stop_sampler_or_other_sinks() -> None:
    good: list[Snapshot] = []

    def bad(_: Snapshot) -> None:
        raise ValueError("sink broke")

    s = Sampler([GpuStub()], interval_s=0.01, source_label="nvml", sinks=[bad, good.append])
    s.start()
    deadline = time.monotonic() + 5
    while len(good) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    s.stop()
    assert len(good) >= 3 and s.sink_failures >= 3


def test_sources_merge_and_unknown_fields_are_reported() -> None:
    class Odd:
        name = "odd"

        def poll(self) -> dict:
            return {"gpus": (GpuSample(ts=0, index=9, uuid="x", name="odd"),), "bogus": (1,), "errors": ("note",)}

        def close(self) -> None:
            pass

    s = Sampler([GpuStub("a"), Odd()], interval_s=1, source_label="nvml")
    snap = s.poll_once()
    assert [g.name for g in snap.gpus] == ["a", "odd"]
    assert set(snap.errors) == {"note", "odd: unknown snapshot field 'bogus' ignored"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.tick = 5  # type: ignore[misc]
    s.stop()


def test_set_interval_and_sinks_are_live() -> None:
    got: list[Snapshot] = []
    s = Sampler([GpuStub()], interval_s=30, source_label="nvml")
    s.add_sink(got.append)
    s.start()
    time.sleep(0.1)
    assert len(got) == 1  # first tick at once, the next one 30 s away
    s.set_interval(0.01)
    time.sleep(0.2)
    s.remove_sink(got.append)
    n = len(got)
    time.sleep(0.1)
    s.stop()
    assert n >= 3 and len(got) == n
    with pytest.raises(ValueError):
        s.set_interval(0)


def test_a_hung_source_does_not_keep_the_process_alive() -> None:
    """After stop(), a source stuck forever in a driver call must not block interpreter exit."""
    import subprocess
    import sys

    code = (
        "import threading, time\n"
        "from gpudash.telemetry.sampler import Sampler\n"
        "class Hung:\n"
        "    name = 'hung'\n"
        "    def poll(self): threading.Event().wait()\n"
        "    def close(self): pass\n"
        "s = Sampler([Hung()], interval_s=0.05, source_label='nvml', source_timeout_s=0.05)\n"
        "s.start(); time.sleep(0.3); s.stop(); print('stopped')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "stopped", out.stderr
