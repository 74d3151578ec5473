"""The signals that end a run, set up once for `launch`, `serve` and `record`.

SIGINT, SIGTERM and SIGHUP (a dropped ssh) each stop the run the same way; for a headless command SIGHUP
first silences the terminal that went away, so no status line after it fails on a write (the dashboard
keeps its terminal, to leave the alternate screen on it when it is still there). While a blocking start runs (servers
loading), `interrupting()` makes them raise KeyboardInterrupt instead, so the caller's `finally` still
stops what was started. The handlers in place before are restored on exit.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from gpudash.hangup import silence_gone_terminal

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """Each of `signals` calls `stop` for as long as the `with` block runs."""

    def __init__(self, stop: Callable[[], None], signals: Iterable[signal.Signals] = STOPPING, *,
                 silence_on_hangup: bool = True) -> None:
        self._stop = stop
        self._signals = tuple(signals)
        self._silence = silence_on_hangup
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for s in self._signals:
            self._previous[s] = signal.signal(s, self._on_stop)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP and self._silence:
            silence_gone_terminal()
        self._stop()

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP and self._silence:
            silence_gone_terminal()
        signal.default_int_handler(signum, frame)

    @contextmanager
    def interrupting(self) -> Iterator[None]:
        """Inside the block, the signals raise KeyboardInterrupt (a blocking call unwinds) instead of `stop`."""
        for s in self._signals:
            signal.signal(s, self._interrupt)
        try:
            yield
        finally:
            for s in self._signals:
                signal.signal(s, self._on_stop)
