"""SQLite store (sqlite-utils): schema + forward migrations, the batched writer, queries and export."""

from gpudash.store.store import SESSION_TABLES, SessionInfo, Store, StoreError
from gpudash.store.writer import StoreWriter

__all__ = ["SESSION_TABLES", "SessionInfo", "Store", "StoreError", "StoreWriter"]
