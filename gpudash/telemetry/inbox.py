"""The app's one inbox for records that happen rather than get sampled: events (who changed what,
server crashes) and probe requests. Producers on any thread `push`; each sampler tick drains it into
the snapshot's `events` and `requests`, so they are recorded alongside the samples of that tick."""

from __future__ import annotations

import threading
from collections import deque

from gpudash.records import Event, RequestSample


class Inbox:
    """Thread-safe, bounded queue of Event / RequestSample records, drained by `poll`.

    When nobody drains it (no sampler running) it keeps the newest `maxlen` records and counts the
    dropped ones; the next poll reports how many were lost.
    """

    name = "inbox"

    def __init__(self, maxlen: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._events: deque[Event] = deque()
        self._requests: deque[RequestSample] = deque()
        self._maxlen = maxlen
        self._dropped = 0

    def push(self, record: Event | RequestSample) -> None:
        """Queue one record; TypeError for anything that is not an Event or a RequestSample."""
        if isinstance(record, Event):
            q: deque = self._events
        elif isinstance(record, RequestSample):
            q = self._requests
        else:
            raise TypeError(f"Inbox.push takes an Event or a RequestSample, got {type(record).__name__}")
        with self._lock:
            if len(self._events) + len(self._requests) >= self._maxlen:
                (self._events if self._events else self._requests).popleft()
                self._dropped += 1
            q.append(record)

    def __len__(self) -> int:
        with self._lock:
            return len(self._events) + len(self._requests)

    def poll(self) -> dict[str, tuple]:
        with self._lock:
            out: dict[str, tuple] = {"events": tuple(self._events), "requests": tuple(self._requests)}
            self._events.clear()
            self._requests.clear()
            dropped, self._dropped = self._dropped, 0
        if dropped:
            out["errors"] = (f"inbox: {dropped} records dropped because nothing drained the inbox",)
        return out

    def close(self) -> None:
        """Nothing to release; records still queued stay for a later drain."""
