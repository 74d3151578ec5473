"""The door between Python threads and one native engine: it counts the calls inside so that close()
can free the engine only once none is left, and it refuses calls after close() began.

Why a count and not a flag: a thread that read "open" may be switched out before its C call; a flag
alone would let close() free the engine under it (a use-after-free that segfaulted the interpreter).
The count is a list that every call appends to and pops from: under the GIL, list.append/pop and
reading `state` are atomic and happen in one global order, so either close() sees the call inside or
the call sees close() (a lock would cost a copy about four times as much).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Concatenate, ParamSpec, TypeVar

from gpudash.engine import _native as N
from gpudash.engine.errors import EngineError

OPEN, CLOSING, FREED = 0, 1, 2
_DRAIN_NAP_S = 0.001  # how often close() looks whether the calls inside have left
T = TypeVar("T")
P = ParamSpec("P")


def closed_error() -> EngineError:
    return EngineError("the engine is closed; create a new TransferEngine", N.ECLOSED, "GE_ECLOSED")


class CallGate:
    """OPEN: every call enters. CLOSING: public calls are refused (EngineError), while the engine's own
    clean-up (unregistering, freeing buffers) still enters. FREED: nothing enters."""

    __slots__ = ("_inside", "state")

    def __init__(self) -> None:
        self._inside: list[None] = []  # one entry per call inside
        self.state = OPEN

    def enter(self) -> None:
        """Enter for a public call; EngineError once close() has begun. Pair with leave()."""
        self._inside.append(None)
        if self.state != OPEN:
            self._inside.pop()
            raise closed_error()

    def enter_cleanup(self) -> bool:
        """Enter for clean-up (a finalizer, a buffer's free); False once the engine is freed: then the
        engine has freed that memory itself and there is nothing to do. Pair a True with leave()."""
        self._inside.append(None)
        if self.state == FREED:
            self._inside.pop()
            return False
        return True

    def leave(self) -> None:
        self._inside.pop()

    def shut(self, state: int) -> None:
        """Move to `state` (CLOSING or FREED), then wait until every call that entered before has left.
        Must not be called from inside the gate (it would wait for itself)."""
        self.state = max(self.state, state)
        while self._inside:
            time.sleep(_DRAIN_NAP_S)


def gated(method: Callable[Concatenate[Any, P], T]) -> Callable[Concatenate[Any, P], T]:
    """A public method of an object with a `_gate`, run inside that gate (EngineError once closed)."""

    @functools.wraps(method)
    def call(self: Any, *args: P.args, **kwargs: P.kwargs) -> T:
        gate = self._gate
        gate.enter()
        try:
            return method(self, *args, **kwargs)
        finally:
            gate.leave()

    return call
