"""Pageable host memory: the policy choosing between a cached registration (pin once, reuse), the
pinned staging ring and a plain driver copy, and the registration cache itself (LRU with a byte cap).

Policy: a buffer seen for the first time is a one-shot buffer: a large copy of it goes through the
staging ring (no pinning cost), a small one (below the `*_staging_bytes` knob) is one driver copy,
which beats the ring there. A buffer seen again is a reused buffer: its whole allocation is registered
once and later copies run at pinned speed. Only numpy arrays that own their memory are cached, because
only their lifetime is known: a weakref finalizer unregisters the range before numpy frees it, so a new
allocation at the same address can never hit a stale registration (safe invalidation). Raw pointers
and foreign buffers are always one-shot. Eviction skips entries used by copies in flight.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable


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
        self._seen: OrderedDict[tuple[int, int], weakref.ref[Any]] = OrderedDict()
        self._refused: set[tuple[int, int]] = set()  # ranges the backend would not register (already pinned)
        self.bytes = 0

    def set_cap(self, cap_bytes: int) -> None:
        with self._lock:
            self._cap = cap_bytes
            self._evict(0)

    def hold(self, owner_ptr: int, owner_nbytes: int) -> int | None:
        """The key of an existing registration of exactly this allocation, now held by one more copy
        (release() it; eviction skips it meanwhile), or None. The hot path of a reused buffer."""
        with self._lock:
            e = self._entries.get(owner_ptr)
            if e is None or e.nbytes != owner_nbytes:
                return None
            e.in_use += 1
            self._entries.move_to_end(owner_ptr)
            return owner_ptr

    def acquire(self, owner: Any, owner_ptr: int, owner_nbytes: int, now: bool = False) -> int | None:
        """Registration key covering the allocation of `owner` (caller must release()), or None: use the
        staging ring or a driver copy. An existing registration is held (hold()); a new one is made on
        the buffer's second sight, or on the first with `now`."""
        if owner is None:
            return None
        key = (owner_ptr, owner_nbytes)
        with self._lock:
            held = self.hold(owner_ptr, owner_nbytes)  # the lock is re-entrant
            if held is not None:
                return held
            if key in self._refused:
                return None
            if key not in self._seen and not now:  # one-shot so far; forgotten when the owner dies
                self._seen[key] = weakref.ref(owner, lambda _r, k=key: self._forget(k))
                if len(self._seen) > 4096:
                    self._seen.popitem(last=False)
                return None
            if owner_nbytes > self._cap or not self._evict(owner_nbytes):
                return None
            if not self._register(owner_ptr, owner_nbytes):
                self._refused.add(key)
                return None
            e = _Entry(owner_ptr, owner_nbytes, in_use=1)
            e.finalizer = weakref.finalize(owner, self._drop, owner_ptr)
            e.finalizer.atexit = False
            self._entries[owner_ptr] = e
            self.bytes += e.nbytes
            return owner_ptr

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
