"""What was recorded, read back: the sessions in a database and one session's tables as files. The
History tab, its export form, `gpudash history` and `gpudash export` all read through here, so a store
that cannot be read is refused the same way everywhere (StoreError or ExportError, one sentence)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gpudash.store import SessionInfo, Store, StoreError
from gpudash.store.energy import SessionEnergy, session_energy
from gpudash.store.export import FORMATS, ExportError, Exported, export_session

EXPORT_FORMATS = FORMATS

__all__ = ["EXPORT_FORMATS", "ExportError", "StoreError", "export_recorded", "is_action", "missing_for",
           "recorded_energy", "recorded_sessions"]


def missing_for(fmt: str) -> str | None:
    """What this install lacks to write `fmt` (Parquet needs pyarrow, which `pip install '.[llama]'` has
    not), said where the format is chosen rather than after the export starts; None when nothing is."""
    if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
        return "parquet needs pyarrow, which is not installed: pip install 'gpudash[parquet]', or pick csv or json"
    return None


ACTION_SOURCE = "cli"  # the source of the session a `gpudash server sleep|wake` writes its events into


def is_action(session: SessionInfo) -> bool:
    """Whether a session is a server action's (sleep, wake: its events only, no samples, no duration)."""
    return session.source == ACTION_SOURCE


def recorded_sessions(db: Path) -> list[SessionInfo]:
    """Every session in the database at `db`, oldest first."""
    with Store.open(db, writing=False) as store:
        return store.sessions()


def recorded_energy(db: Path) -> dict[int, list[SessionEnergy]]:
    """Each session's servers' energy and tokens (store/energy.py), by session id."""
    with Store.open(db, writing=False) as store:
        return session_energy(store.db)


def export_recorded(db: Path, session: str | int, fmt: str, folder: Path, force: bool = False) -> tuple[int, list[Exported]]:
    """The session's tables as `fmt` files in `folder` (never over files there unless `force`); returns the
    session id ("latest" resolved) and what was written."""
    with Store.open(db, writing=False) as store:
        sid = store.resolve_session(str(session))
        return sid, export_session(store, sid, fmt, folder, force=force)
