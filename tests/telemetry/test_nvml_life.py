"""NVML's life in gpudash, over a faked pynvml (no GPU needed), as nvitop's libnvml keeps it: a function
whose newest C symbol the driver lacks falls back to its older `_v3` / `_v2` variant, and nvmlShutdown
runs once at exit, only after the NVML calls in flight have returned (the Xid watcher's included)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pynvml
import pytest

from gpudash.gpu import device, nvml


def _missing(*_: object) -> None:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def _unsupported(*_: object) -> None:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """nvml.py as a new process has it, over a pynvml whose init works; returns what atexit was given."""
    registered: list[object] = []
    for name, value in (("_initialised", False), ("_init_error", None), ("_closing", False), ("_in_flight", 0),
                        ("_chosen", {})):
        monkeypatch.setattr(nvml, name, value)
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(nvml.atexit, "register", registered.append)
    return registered


def test_an_older_driver_is_asked_through_the_newest_variant_it_has(fresh, monkeypatch) -> None:
    calls: list[str] = []

    def variant(name: str, answer):
        def fn(handle):
            calls.append(name)
            return answer(handle) if callable(answer) else answer
        return fn

    procs = [SimpleNamespace(pid=4242, usedGpuMemory=2**30)]
    base = "nvmlDeviceGetComputeRunningProcesses"
    monkeypatch.setattr(pynvml, base, variant("", _missing))  # nvidia-ml-py's newest (v3) C symbol: absent
    monkeypatch.setattr(pynvml, base + "_v3", variant("_v3", _missing), raising=False)
    monkeypatch.setattr(pynvml, base + "_v2", variant("_v2", procs), raising=False)
    monkeypatch.delattr(pynvml, base + "_v1", raising=False)
    assert nvml.versioned(base, "h") == procs and calls == ["", "_v3", "_v2"]
    assert nvml.versioned(base, "h") == procs and calls == ["", "_v3", "_v2", "_v2"]  # remembered: _v2 first

    # A driver that has the newest symbol but no value for this GPU: NA, and no older variant is tried.
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", variant("g", _unsupported))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses_v2", variant("g_v2", []), raising=False)
    assert nvml.versioned("nvmlDeviceGetGraphicsRunningProcesses", "h") is nvml.NA and calls[-1] == "g"
    assert nvml.versioned("nvmlDeviceGetNoSuchThing", "h") is nvml.NA  # a name pynvml does not have

    # The process list reads through it: the server's memory shows although the v3 symbol is missing.
    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", _unsupported)
    dev = device.Device.__new__(device.Device)  # no GPU here: only the handle-free readers are exercised
    dev.index, dev.handle, dev._sm_since, dev._sm_read_at, dev._sm_last = 0, "h", 0, -device.PROCESS_SM_EVERY_S, {}
    (p,) = dev.processes(1.0, {4242: "tiny"})
    assert (p.pid, p.used_bytes, p.server) == (4242, 2**30, "tiny")


def test_shutdown_waits_for_the_calls_in_flight_then_runs_once(fresh, monkeypatch) -> None:
    order: list[str] = []
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: order.append("nvmlShutdown"))
    assert nvml.init() is None and fresh == [nvml.shutdown]  # registered at exit by the first init

    entered, release = threading.Event(), threading.Event()

    def slow_query() -> int:  # e.g. nvmlDeviceGetPcieThroughput, which blocks ~20 ms on a GPU
        entered.set()
        release.wait(5)
        order.append("query returned")
        return 7

    answers: list[object] = []
    poller = threading.Thread(target=lambda: answers.append(nvml.call(slow_query)))
    poller.start()
    assert entered.wait(5)
    closer = threading.Thread(target=nvml.shutdown)
    closer.start()
    time.sleep(0.2)
    assert order == [] and closer.is_alive()  # NVML stays up under the running query
    ran: list[int] = []
    assert nvml.call(lambda: ran.append(1)) is nvml.NA and ran == []  # nothing new starts meanwhile
    release.set()
    poller.join(5)
    closer.join(5)
    assert answers == [7] and order == ["query returned", "nvmlShutdown"]
    nvml.shutdown()
    assert order.count("nvmlShutdown") == 1
    assert nvml.driver_available() is not None  # after shutdown, NVML is not initialised again


def test_a_query_that_hangs_is_not_shut_down_under(fresh, monkeypatch) -> None:
    shut: list[int] = []
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: shut.append(1))
    assert nvml.init() is None
    entered, release = threading.Event(), threading.Event()
    hung = threading.Thread(target=nvml.call, args=(lambda: (entered.set(), release.wait(5)),))
    hung.start()
    assert entered.wait(5)
    t0 = time.monotonic()
    nvml.shutdown(wait_s=0.2)
    assert shut == [] and time.monotonic() - t0 < 2  # gave up waiting: left to the process's exit
    release.set()
    hung.join(5)


def test_without_a_driver_shutdown_has_nothing_to_do(fresh, monkeypatch) -> None:
    shut: list[int] = []
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: shut.append(1))
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: _raise(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)))
    assert nvml.init() == "the NVIDIA kernel driver is not loaded" and fresh == []
    nvml.shutdown()
    assert shut == []


def _raise(err: Exception) -> None:
    raise err


def test_the_xid_watcher_s_calls_count_in_flight_too(fresh, monkeypatch) -> None:
    """The event set's calls need NVML's exceptions, so they go through nvml.in_flight rather than call():
    shutdown waits for a wait in progress, and after it the watcher calls NVML no more."""
    from gpudash.gpu.xid import WATCHED, XidWatcher

    order: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def wait(event_set, timeout_ms):
        entered.set()
        release.wait(5)
        order.append("wait returned")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)  # the set is empty

    for name, fn in (("nvmlEventSetCreate", lambda: "set"), ("nvmlDeviceGetSupportedEventTypes", lambda h: 0xFFFF),
                     ("nvmlDeviceRegisterEvents", lambda h, mask, s: None), ("nvmlEventSetWait_v2", wait),
                     ("nvmlEventSetFree", lambda s: order.append("freed")),
                     ("nvmlShutdown", lambda: order.append("nvmlShutdown"))):
        monkeypatch.setattr(pynvml, name, fn)
    assert nvml.init() is None
    watcher = XidWatcher({0: "h"}, guard=nvml.in_flight)
    assert watcher.watching == {0: sum(WATCHED) & 0xFFFF}
    poll = threading.Thread(target=watcher.poll, args=(1.0,))
    poll.start()
    assert entered.wait(5)
    closer = threading.Thread(target=nvml.shutdown)
    closer.start()
    time.sleep(0.2)
    assert order == []  # NVML stays up under the event wait
    release.set()
    poll.join(5)
    closer.join(5)
    assert order == ["wait returned", "nvmlShutdown"]
    entered.clear()
    assert watcher.poll(2.0) == () and not entered.is_set()  # NVML is down: no wait is made
    watcher.close()
    assert "freed" not in order  # the set went with NVML
