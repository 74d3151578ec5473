"""`gpudash server sleep|wake NAME`: one action on a server that runs elsewhere, through the controller like
every other change, recorded in a store session of its own with the event and the seconds it took."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpudash.config import Config
from gpudash.launcher.health import url_host
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.remote import RemoteServer
from gpudash.launcher.sleep import SleepResult
from gpudash.records import Event
from gpudash.runtime.control import Controller, Result, ServerAction
from gpudash.store import Store


class ActionRefused(ValueError):
    """The action cannot be asked for as given (unknown server, no address, a level the kind refuses); the
    server was not contacted. One sentence."""


@dataclass(frozen=True)
class ActionDone:
    result: Result  # the controller's: ok, reason, the request event
    outcome: SleepResult | None  # the timed answer, when the server was asked and answered
    asked: bool  # whether the server was asked at all
    session: int


class _StoreEvents:
    """An event sink that writes each event into one store session at once."""

    def __init__(self, store: Store, session: int) -> None:
        self._store, self._session = store, session

    def push(self, record: Event) -> None:
        self._store.record_event(self._session, record)


def server_action(cfg: Config, db: Path, name: str, action: str, level: int = 1, url: str | None = None) -> ActionDone:
    """Sleep or wake configured server `name` at `url` (default: its host and fixed port). ActionRefused
    before anything is contacted or written; StoreError when the database cannot be used."""
    specs = {s.name: s for s in cfg.servers}
    if name not in specs:
        raise ActionRefused(f"no server named {name!r} in the config; configured: {', '.join(specs) or 'none'}")
    spec = specs[name]
    if spec.kind is None:
        raise ActionRefused(f"server {name!r} is attached with no `kind`; sleep and wake need its kind: set kind "
                            "in its [[servers]] entry")
    kind = kind_of(spec)
    if not kind.sleep_levels:  # said first: no address or origin changes that (an attached entry said "--url")
        raise ActionRefused(f"server {name!r} is {kind.label}, which has no sleep mode (sleep and wake are vLLM's, "
                            "started with enable_sleep_mode)")
    if url is None and spec.url is not None:
        url = spec.url
    if url is None:
        if spec.port is None:
            raise ActionRefused(f"server {name!r} has no fixed `port`, so its address is unknown here; pass --url "
                                "http://HOST:PORT or set `port` in its [[servers]] entry")
        url = f"http://{url_host(spec.host)}:{spec.port}"
    elif not url.startswith(("http://", "https://")):
        raise ActionRefused(f"--url '{url}' must start with http:// or https://, e.g. http://127.0.0.1:8000")
    with Store.open(db) as store:  # opened before acting, so a bad store leaves the server untouched
        sid = store.begin_session("cli", cfg, note=f"gpudash server {action} {name}")
        try:
            events = _StoreEvents(store, sid)
            target = RemoteServer(spec, url, events)
            result = Controller(supervisor=target, inbox=events).apply(ServerAction(name, action, level), actor="cli")
        finally:
            store.end_session(sid)
    return ActionDone(result, target.result, target.asked, sid)
