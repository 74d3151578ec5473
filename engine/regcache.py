"""Pageable host memory: the policy choosing between a cached registration (pin once, reuse) and the
pinned staging ring, and the registration cache itself (LRU with a byte cap).

Policy: a buffer seen for the first time is a one-shot buffer: it goes through the staging ring (no
pinning cost). A buffer seen again is a reused buffer: its whole allocation is registered once and
later copies run at pinned speed. Only numpy arrays that own their memory are cached, because only
their lifetime is known: a weakref finalizer unregisters the range before numpy frees it, so a new
allocation at the same address can never hit a stale registration (safe invalidation). Raw pointers
and foreign buffers always use the staging ring. Eviction skips entries used by copies in flight.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from engine.buffers import Span


@dataclass
class _Entry:
    ptr: int
    nbytes: int
    in_use: int = 0
    finalizer: weakref.finalize | None = field(default=None, repr=False)


class RegistrationCache:
    """(ptr, nbytes) of owning arrays -> registration; thread-safe."""

    def __init__(self, register: Callable[[int, int], bool], unregister: Callable[[int], None], cap_bytes: int):
        self._register = register
        self._unregister = unregister
        self._cap = cap_bytes
        self._lock = threading.RLock()  # finalizers may run inside acquire() (GC)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # by ptr, LRU order
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._refused: set[tuple[int, int]] = set()  # ranges the backend would not register (already pinned)
        self.bytes = 0

    def set_cap(self, cap_bytes: int) -> None:
        with self._lock:
            self._cap = cap_bytes
            self._evict(0)

    def acquire(self, span: Span, now: bool = False) -> int | None:
        """Registration key covering `span` (caller must release()), or None: use the staging ring.
        `now`: register on first sight instead of waiting for the buffer to be reused."""
        owner = span.owner
        if owner is None:
            return None
        key = (span.owner_ptr, span.owner_nbytes)
        with self._lock:
            e = self._entries.get(span.owner_ptr)
            if e is not None and e.nbytes == span.owner_nbytes:
                e.in_use += 1
                self._entries.move_to_end(span.owner_ptr)
                return span.owner_ptr
            if key in self._refused:
                return None
            if key not in self._seen and not now:  # one-shot so far
                self._seen[key] = None
                if len(self._seen) > 4096:
                    self._seen.popitem(last=False)
                weakref.finalize(owner, self._forget, key).atexit = False
                return None
            if span.owner_nbytes > self._cap or not self._evict(span.owner_nbytes):
                return None
            if not self._register(span.owner_ptr, span.owner_nbytes):
                self._refused.add(key)
                return None
            e = _Entry(span.owner_ptr, span.owner_nbytes, in_use=1)
            e.finalizer = weakref.finalize(owner, self._drop, span.owner_ptr)
            e.finalizer.atexit = False
            self._entries[span.owner_ptr] = e
            self.bytes += e.nbytes
            return span.owner_ptr

    def release(self, key: int) -> None:
        with self._lock:
            e = self._entries.get(key)
            if e is not None:
                e.in_use -= 1

    def _forget(self, key: tuple[int, int]) -> None:
        with self._lock:
            self._seen.pop(key, None)
            self._refused.discard(key)

    def _drop(self, ptr: int) -> None:
        """The owner is being freed: unregister before its memory goes back to the allocator."""
        with self._lock:
            e = self._entries.pop(ptr, None)
            if e is not None:
                self.bytes -= e.nbytes
                self._unregister(ptr)

    def _evict(self, need: int) -> bool:
        """Make room for `need` bytes under the cap (lock held); False if in-flight entries prevent it."""
        for ptr in list(self._entries):
            if self.bytes + need <= self._cap:
                break
            e = self._entries[ptr]
            if e.in_use:
                continue
            del self._entries[ptr]
            if e.finalizer is not None:
                e.finalizer.detach()
            self.bytes -= e.nbytes
            self._unregister(ptr)
        return self.bytes + need <= self._cap

    def clear(self) -> None:
        with self._lock:
            for ptr, e in list(self._entries.items()):
                if e.finalizer is not None:
                    e.finalizer.detach()
                self._unregister(ptr)
            self._entries.clear()
            self.bytes = 0
