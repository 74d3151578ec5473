"""Xid and other fatal GPU driver events, as gpudash Events (kind "gpu.xid", "gpu.ecc", "gpu.lost").

An Xid is the driver's report of a GPU fault (79: the GPU fell off the bus, 48: a double-bit ECC error,
...); operators otherwise find them in the kernel log after the fact. NVML queues them in an event set
once a GPU is registered for them; `XidWatcher.poll` drains that set without waiting (timeout 0), so
the tick never blocks and an idle set costs one call. Where the driver does not allow it (no support,
no permission, a container without the event device), the watcher says so once and watches nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pynvml

from gpudash.records import GPU_FAULT_KINDS, Event

XID, ECC, LOST = GPU_FAULT_KINDS
# NVML event type -> (Event kind, what it means); only these are watched, where the GPU supports them.
WATCHED = {
    pynvml.nvmlEventTypeXidCriticalError: (XID, "Xid"),
    pynvml.nvmlEventTypeDoubleBitEccError: (ECC, "double-bit ECC error"),
    pynvml.nvmlEventTypeGpuUnavailableError: (LOST, "GPU unavailable"),
}
# What common Xids mean, after NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors); others are
# shown by number.
XID_MEANING = {
    13: "graphics engine exception", 31: "GPU memory page fault", 32: "corrupted push buffer stream",
    38: "driver firmware error", 43: "GPU stopped processing", 45: "preemptive cleanup after earlier errors",
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint", 62: "internal micro-controller halt",
    63: "ECC page retirement or row remap recorded", 64: "ECC page retirement or row remap failed",
    69: "graphics engine class error", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    109: "context switch timeout", 119: "GSP RPC timeout", 120: "GSP error", 140: "unrecovered ECC error",
}
MAX_PER_TICK = 64  # a storm is drained over several ticks rather than stalling one


def describe_xid(xid: int) -> str:
    meaning = XID_MEANING.get(xid)
    return f"Xid {xid}: {meaning}" if meaning else f"Xid {xid}"


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidWatcher:
    """Registers every GPU for the WATCHED events it supports, and turns queued events into Events."""

    def __init__(self, handles: dict[int, Any],
                 guard: Callable[[], AbstractContextManager[bool]] = lambda: nullcontext(True)) -> None:
        """`handles`: NVML device handle per GPU index; `guard`: what counts this watcher's NVML calls in
        flight (nvml.in_flight, so that NVML is not shut down under one), yielding False once it is down."""
        self.notes: list[str] = []
        self.watching: dict[int, int] = {}  # GPU index -> the event types registered
        self._handles = handles
        self._index = {_address(h): i for i, h in handles.items()}
        self._guard = guard
        self._set: Any = None
        with guard() as up:
            if up:
                self._register(handles)

    def _register(self, handles: dict[int, Any]) -> None:
        try:
            self._set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            self.notes.append(f"nvml: Xid events are not available here ({err}); the Events tab will not show them")
            return
        refused = []
        for index, handle in handles.items():
            try:
                wanted = sum(WATCHED) & pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                if wanted:
                    pynvml.nvmlDeviceRegisterEvents(handle, wanted, self._set)
                    self.watching[index] = wanted
            except pynvml.NVMLError as err:
                refused.append(f"GPU {index} ({err})")
        if refused:
            self.notes.append(f"nvml: Xid events of {', '.join(refused)} are not watched")

    def poll(self, ts: float) -> tuple[Event, ...]:
        """The events queued since the last poll (at most MAX_PER_TICK), never waiting for one."""
        out: list[Event] = []
        with self._guard() as up:
            while up and self._set is not None and len(out) < MAX_PER_TICK:
                try:
                    data = pynvml.nvmlEventSetWait_v2(self._set, 0)
                except pynvml.NVMLError as err:
                    if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:  # the wait's own word that a GPU is gone
                        out += self._lost(ts)
                    if err.value != pynvml.NVML_ERROR_TIMEOUT:  # TIMEOUT: the set is empty
                        self.notes.append(f"nvml: reading Xid events failed ({err}); they are no longer watched")
                        self._free()
                    break
                out.append(self._event(data, ts))
        return tuple(out)

    def _lost(self, ts: float) -> list[Event]:
        """A gpu.lost Event for each GPU that a cheap query finds gone (the set's wait does not say
        which one), or one for an unknown GPU: the watcher stops after this, so it is said once."""
        lost = []
        for index, handle in self._handles.items():
            try:
                pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    lost.append(f"GPU{index}")
        return [Event(ts=ts, actor="driver", kind=LOST, target=target, ok=False,
                      reason="GPU is lost: it fell off the bus or is otherwise inaccessible (NVML)")
                for target in lost or ["GPU?"]]

    def _event(self, data: Any, ts: float) -> Event:
        kind, what = WATCHED.get(int(data.eventType), ("gpu.event", f"event type {int(data.eventType):#x}"))
        index = self._index.get(_address(data.device))
        target = f"GPU{index}" if index is not None else "GPU?"
        value = int(data.eventData)
        reason = describe_xid(value) if kind == XID else what
        return Event(ts=ts, actor="driver", kind=kind, target=target, new=value, ok=False, reason=reason)

    def take_notes(self) -> tuple[str, ...]:
        notes, self.notes = tuple(self.notes), []
        return notes

    def close(self) -> None:
        with self._guard() as up:
            if up:
                self._free()
            self._set = None  # NVML shut down: the driver freed the set with it

    def _free(self) -> None:
        if self._set is not None:
            try:
                pynvml.nvmlEventSetFree(self._set)
            except pynvml.NVMLError:
                pass
            self._set = None
