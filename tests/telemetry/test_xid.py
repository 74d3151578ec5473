"""XidWatcher without a GPU: NVML's event-set calls replaced by a queue, the watcher's own logic real
(the gpu-marked test in tests/gpu registers the real H200 for them)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pynvml
import pytest

from gpudash.gpu import xid


class FakeEventSet:
    """What NVML's event API does, as NVIDIA's NVML API Reference ("Event Handling Methods", the comments
    of nvml.h) documents it: nvmlDeviceGetSupportedEventTypes gives a device's event mask,
    nvmlDeviceRegisterEvents registers a device for some of them, and nvmlEventSetWait_v2 returns a
    queued event at once or NVML_ERROR_TIMEOUT "if no event arrived in specified timeout" (0 here), and
    may return NVML_ERROR_GPU_IS_LOST, which any query of a lost GPU's device returns too."""

    def __init__(self, supported: dict[int, int], monkeypatch) -> None:
        self.supported = supported  # device address -> supported event type mask
        self.registered: dict[int, int] = {}
        self.queue: list[SimpleNamespace] = []
        self.freed = False
        self.fail_wait: int | None = None
        self.lost: set[int] = set()  # device addresses whose queries answer GPU_IS_LOST
        for name, fn in (("nvmlEventSetCreate", lambda: "set"), ("nvmlDeviceGetSupportedEventTypes", self.types),
                         ("nvmlDeviceRegisterEvents", self.register), ("nvmlEventSetWait_v2", self.wait),
                         ("nvmlEventSetFree", self.free), ("nvmlDeviceGetMemoryInfo", self.memory)):
            monkeypatch.setattr(pynvml, name, fn)

    def types(self, handle) -> int:
        mask = self.supported[handle.value]
        if mask is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return mask

    def register(self, handle, mask, event_set) -> None:
        self.registered[handle.value] = mask

    def wait(self, event_set, timeout_ms):
        assert timeout_ms == 0  # the tick never waits
        if self.fail_wait is not None:
            raise pynvml.NVMLError(self.fail_wait)
        if not self.queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.queue.pop(0)

    def free(self, event_set) -> None:
        self.freed = True

    def memory(self, handle) -> SimpleNamespace:
        if handle.value in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(total=1, used=0, free=1)


def handle(address: int) -> ctypes.c_void_p:
    return ctypes.c_void_p(address)


def test_faults_become_events_of_the_right_gpu(monkeypatch) -> None:
    all_types = sum(xid.WATCHED) | pynvml.nvmlEventTypePState
    nvml = FakeEventSet({0x10: all_types, 0x20: pynvml.nvmlEventTypeXidCriticalError}, monkeypatch)
    w = xid.XidWatcher({0: handle(0x10), 1: handle(0x20)})
    assert nvml.registered == {0x10: sum(xid.WATCHED), 0x20: pynvml.nvmlEventTypeXidCriticalError}
    assert w.poll(5.0) == () and w.take_notes() == ()
    nvml.queue += [SimpleNamespace(device=handle(0x20), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=79),
                   SimpleNamespace(device=handle(0x10), eventType=pynvml.nvmlEventTypeDoubleBitEccError, eventData=0),
                   SimpleNamespace(device=handle(0x10), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=999)]
    got = w.poll(7.0)
    assert [(e.kind, e.target, e.new, e.reason, e.ok, e.ts) for e in got] == [
        ("gpu.xid", "GPU1", 79, "Xid 79: GPU has fallen off the bus", False, 7.0),
        ("gpu.ecc", "GPU0", 0, "double-bit ECC error", False, 7.0),
        ("gpu.xid", "GPU0", 999, "Xid 999", False, 7.0)]
    assert w.poll(8.0) == ()


def test_a_storm_is_drained_over_ticks(monkeypatch) -> None:
    nvml = FakeEventSet({0x10: pynvml.nvmlEventTypeXidCriticalError}, monkeypatch)
    w = xid.XidWatcher({0: handle(0x10)})
    nvml.queue += [SimpleNamespace(device=handle(0x10), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=13)
                   for _ in range(xid.MAX_PER_TICK + 5)]
    assert len(w.poll(1.0)) == xid.MAX_PER_TICK and len(w.poll(2.0)) == 5


def test_what_the_driver_refuses_is_said_once(monkeypatch) -> None:
    nvml = FakeEventSet({0x10: None, 0x20: pynvml.nvmlEventTypeXidCriticalError}, monkeypatch)
    w = xid.XidWatcher({0: handle(0x10), 1: handle(0x20)})
    assert w.watching == {1: pynvml.nvmlEventTypeXidCriticalError}
    (note,) = w.take_notes()
    assert "GPU 0" in note and "not watched" in note and w.take_notes() == ()
    nvml.fail_wait = pynvml.NVML_ERROR_UNKNOWN
    assert w.poll(1.0) == ()
    (note,) = w.take_notes()
    assert "no longer watched" in note and nvml.freed
    assert w.poll(2.0) == ()  # closed: no more calls


@pytest.mark.parametrize("lost, targets", [({0x20}, ["GPU1"]), (set(), ["GPU?"])])
def test_a_lost_gpu_is_an_event_once(monkeypatch, lost: set[int], targets: list[str]) -> None:
    """The event wait answering GPU_IS_LOST names no GPU: the one whose query fails the same way is
    named (else an unknown one), once, and the watcher stops."""
    nvml = FakeEventSet({0x10: pynvml.nvmlEventTypeXidCriticalError, 0x20: pynvml.nvmlEventTypeXidCriticalError},
                        monkeypatch)
    w = xid.XidWatcher({0: handle(0x10), 1: handle(0x20)})
    nvml.fail_wait, nvml.lost = pynvml.NVML_ERROR_GPU_IS_LOST, lost
    got = w.poll(3.0)
    assert [(e.kind, e.target, e.actor, e.ok, e.ts) for e in got] == [("gpu.lost", t, "driver", False, 3.0)
                                                                      for t in targets]
    assert "inaccessible" in got[0].reason
    assert "no longer watched" in w.take_notes()[0] and nvml.freed
    assert w.poll(4.0) == ()


def test_no_event_sets_at_all(monkeypatch) -> None:
    def refuse():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", refuse)
    w = xid.XidWatcher({0: handle(0x10)})
    assert w.poll(1.0) == () and w.watching == {}
    (note,) = w.take_notes()
    assert "not available" in note


@pytest.mark.parametrize("number,text", [(48, "Xid 48: double-bit ECC error"), (12345, "Xid 12345")])
def test_describe_xid(number, text) -> None:
    assert xid.describe_xid(number) == text
