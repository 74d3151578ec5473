"""What the store recorded of the servers' prompt caches: probe requests and host-cache restores of the
latest sessions, for the doctor's restore-versus-recompute check."""

from __future__ import annotations

from pathlib import Path

from gpudash.launcher.probe.cache_kinds import RESTORE_EVENT
from gpudash.records import Event, RequestSample

RECENT_SESSIONS = 5


def recorded_probe(path: Path) -> tuple[tuple[RequestSample, ...], tuple[Event, ...], str]:
    """(requests, restore events, why none) of the store's last RECENT_SESSIONS sessions."""
    from gpudash.store import Store, StoreError, codec

    if not path.exists():
        return (), (), f"no store at {path}; record probe requests with `gpudash serve` or `gpudash launch`"
    try:
        store = Store.open(path, writing=False)
    except StoreError as err:
        return (), (), f"the store cannot be read: {err}"
    try:
        requests: list[RequestSample] = []
        events: list[Event] = []
        for info in store.sessions()[-RECENT_SESSIONS:]:
            requests += [codec.decode("requests", r) for r in store.rows(info.id, "requests")]
            events += [e for e in (codec.decode("events", r) for r in store.rows(info.id, "events"))
                       if e.kind == RESTORE_EVENT]
    finally:
        store.close()
    return tuple(requests), tuple(events), ""
