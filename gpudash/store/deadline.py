"""A deadline on every statement read from a database someone handed gpudash.

A recording is a file anyone can craft: a view that recurses for ever, or a query plan that never ends,
would hang `history`, `export` and `replay` with no way to tell. SQLite calls a progress handler every few
thousand virtual-machine steps; this connection's handler interrupts a statement that has run `limit_s`
since it started or since it last handed a row to Python, so a long export streams on while a statement
that never yields ends in sqlite3.OperationalError ("interrupted") after `limit_s`.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

READ_DEADLINE_S = 60.0  # without a row: no read of gpudash's own tables takes a fraction of this
_STEPS = 10_000  # VM steps between two looks at the clock (microseconds of work)


class DeadlineConnection(sqlite3.Connection):
    """sqlite3.connect(..., factory=DeadlineConnection); `arm(limit_s)` starts the deadline."""

    limit_s = READ_DEADLINE_S
    _mark = 0.0

    def arm(self, limit_s: float = READ_DEADLINE_S) -> None:
        self.limit_s, self._mark = limit_s, time.monotonic()
        self.set_progress_handler(self._late, _STEPS)

    def _late(self) -> int:
        return int(time.monotonic() - self._mark > self.limit_s)

    def mark(self) -> None:
        self._mark = time.monotonic()

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.mark()
        return self.cursor(_Cursor).execute(sql, parameters)


class _Cursor(sqlite3.Cursor):
    """Restarts its connection's clock before each row it steps to."""

    def __next__(self) -> Any:
        self.connection.mark()
        return super().__next__()
