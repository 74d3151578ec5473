"""Bounded growth: full-resolution samples for a while, 1-minute means and maxima after that, nothing
past the retention age, and never more than a size cap.

A recorder left running for months would otherwise grow by tens of MB per GPU-day. `prune` applies a
`Retention` in three steps, each in its own transaction so a kill between them loses nothing:

1. samples older than `raw_s` fold into `<table>_1m` rows (one per minute, session and identity, e.g.
   one GPU) holding the mean of every numeric column, its maximum (`<column>_max`), the count `n`, and
   each status text (a GPU's throttle reasons, a server's state) as every value seen, comma-joined;
   the raw rows and their now empty ticks go (ticks that carry requests or events stay for replay);
2. everything older than `retain_s` goes: raw rows, 1-minute rows, requests, events, and sessions that
   ended before then;
3. while the data is above `max_bytes`, the oldest slice goes the same way (the last hour always stays).

Freed pages go back to the filesystem where the file allows it (auto_vacuum=incremental, set on new
files and by `vacuum`), in steps of `_VACUUM_STEP_PAGES` pages, each its own short transaction, so a
writer waits for one step at most (the store writer flushes its queue between steps); then the WAL is
truncated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlite_utils

from gpudash.records import SAMPLE_TABLES
from gpudash.store.schema import BUCKET_S, FLAG_BITS, ROLLUP_TABLES, immediate, rollup_flags, rollup_split, rollup_table

if TYPE_CHECKING:
    from gpudash.config import StoreConfig

_KEEP_LAST_S = 3600.0
_MAX_SIZE_STEPS = 50
# Free pages handed back per step: 4 MiB at SQLite's default page size, some milliseconds of work.
_VACUUM_STEP_PAGES = 1024


@dataclass(frozen=True, slots=True)
class Retention:
    """How long each tier lives (None: no limit), and how often a running writer applies it."""

    raw_s: float | None = 86400.0
    retain_s: float | None = None
    max_bytes: int | None = None
    every_s: float = 3600.0

    @classmethod
    def from_config(cls, store: StoreConfig) -> Retention:
        day = 86400.0
        return cls(raw_s=None if store.raw_days is None else store.raw_days * day,
                   retain_s=None if store.retain_days is None else store.retain_days * day,
                   max_bytes=store.max_bytes, every_s=store.prune_interval_s)


@dataclass(frozen=True, slots=True)
class PruneReport:
    rolled_rows: int  # raw sample rows folded into the 1-minute tier
    deleted_rows: int  # rows removed for age or size (every table)
    deleted_sessions: int
    bytes_before: int
    bytes_after: int


def data_bytes(db: sqlite_utils.Database) -> int:
    """Bytes of pages in use (the file minus its free pages)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * db.execute("PRAGMA page_size").fetchone()[0]


def prune(db: sqlite_utils.Database, policy: Retention, now: float | None = None,
          between: Callable[[], None] | None = None) -> PruneReport:
    """Apply `policy` to the whole file (every session); see the module docstring. `between` runs between
    the steps that give free pages back (the store writer flushes there)."""
    now = time.time() if now is None else now
    before = data_bytes(db)
    rolled = deleted = sessions = 0
    if policy.raw_s is not None:
        rolled = _roll_up(db, (now - policy.raw_s) // BUCKET_S * BUCKET_S)
    if policy.retain_s is not None:
        d, s = _drop_before(db, now - policy.retain_s)
        deleted, sessions = deleted + d, sessions + s
    if policy.max_bytes is not None:
        for _ in range(_MAX_SIZE_STEPS):
            oldest = _oldest(db)
            if data_bytes(db) <= policy.max_bytes or oldest is None or oldest >= now - _KEEP_LAST_S:
                break
            cut = min(oldest + max(_KEEP_LAST_S, (now - oldest) / 10), now - _KEEP_LAST_S)
            d, s = _drop_before(db, cut)
            deleted, sessions = deleted + d, sessions + s
    give_back(db, between)
    return PruneReport(rolled, deleted, sessions, before, data_bytes(db))


def vacuum(db: sqlite_utils.Database) -> None:
    """Rewrite the file compactly, and switch it to incremental auto-vacuum so later prunes shrink it."""
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    db.execute("VACUUM")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _roll_up(db: sqlite_utils.Database, cut: float) -> int:
    """Fold raw rows with ts < cut (a minute boundary, so no minute is split) into the 1-minute tier."""
    total = 0
    with immediate(db):
        for table in ROLLUP_TABLES:
            keys, statuses, nums = rollup_split(table)
            names = [c.name for c in keys]
            target = ["session_id", "bucket", "n", *names, *(c.name for c in statuses)]
            select = ["session_id", f"CAST(ts / {BUCKET_S} AS INTEGER) * {BUCKET_S} AS b", "count(*)",
                      *(f"[{n}]" for n in names), *(f"group_concat(DISTINCT [{c.name}])" for c in statuses)]
            for c in nums:
                target += [c.name, f"{c.name}_max"]
                select += [f"avg([{c.name}])", f"max([{c.name}])"]
            for c in rollup_flags(table):  # every flag seen in the minute: SQLite has no OR aggregate
                target.append(c.name)
                select.append(" | ".join(f"max([{c.name}] & {1 << bit})" for bit in range(FLAG_BITS)))
            group = ", ".join(["session_id", "b", *(f"[{n}]" for n in names)])
            db.execute(f"INSERT INTO [{rollup_table(table)}] ({', '.join(f'[{t}]' for t in target)}) "
                       f"SELECT {', '.join(select)} FROM [{table}] WHERE ts < ? GROUP BY {group}", [cut])
            total += db.execute(f"DELETE FROM [{table}] WHERE ts < ?", [cut]).rowcount
        db.execute("DELETE FROM ticks WHERE ts < ? AND NOT EXISTS (SELECT 1 FROM requests r WHERE "
                   "r.session_id = ticks.session_id AND r.tick = ticks.tick) AND NOT EXISTS (SELECT 1 FROM "
                   "events e WHERE e.session_id = ticks.session_id AND e.tick = ticks.tick)", [cut])
    return total


def _drop_before(db: sqlite_utils.Database, cut: float) -> tuple[int, int]:
    """Delete every row older than `cut`, then the sessions that ended before it and hold nothing more."""
    n = 0
    with immediate(db):
        for table in SAMPLE_TABLES:
            n += db.execute(f"DELETE FROM [{table}] WHERE ts < ?", [cut]).rowcount
        for table in ROLLUP_TABLES:
            n += db.execute(f"DELETE FROM [{rollup_table(table)}] WHERE bucket < ?", [cut]).rowcount
        n += db.execute("DELETE FROM ticks WHERE ts < ?", [cut]).rowcount
        holds = " OR ".join(f"EXISTS (SELECT 1 FROM [{t}] x WHERE x.session_id = sessions.id)"
                            for t in ("ticks", *map(rollup_table, ROLLUP_TABLES)))
        gone = db.execute(f"DELETE FROM sessions WHERE coalesce(ended, started) < ? AND NOT ({holds})",
                          [cut]).rowcount
    return n, gone


def _oldest(db: sqlite_utils.Database) -> float | None:
    """The oldest timestamp still held: raw ticks or 1-minute rows."""
    parts = ["SELECT min(ts) AS t FROM ticks",
             *(f"SELECT min(bucket) FROM [{rollup_table(t)}]" for t in ROLLUP_TABLES)]
    return db.execute(f"SELECT min(t) FROM ({' UNION ALL '.join(parts)})").fetchone()[0]


def give_back(db: sqlite_utils.Database, between: Callable[[], None] | None = None) -> None:
    """Hand the file's free pages back to the filesystem, _VACUUM_STEP_PAGES at a time, each step its own
    transaction, `between` run after each; then truncate the WAL (the checkpoint is what shrinks the
    file). The pragma frees one page per step of its statement, so every row of it is fetched
    (executing it alone freed a single page)."""
    if db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:  # incremental
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        while free > 0:
            db.execute(f"PRAGMA incremental_vacuum({min(free, _VACUUM_STEP_PAGES)})").fetchall()
            left = db.execute("PRAGMA freelist_count").fetchone()[0]
            if left >= free:  # nothing moved (cannot happen with the write lock taken; never loop on it)
                break
            free = left
            if between is not None:
                between()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
