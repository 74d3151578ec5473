"""The SQLite schema: one table per record kind, derived from `records.SAMPLE_TABLES`, plus `sessions`,
`ticks` and `schema_version`, built by an ordered list of forward migrations.

Columns come from the record dataclasses so a new record field cannot be forgotten: after the
migrations run, `sync_columns` adds any field a table lacks as a nullable column. Values that are not
SQLite scalars (an Event's `old`/`new`) are stored as JSON text; booleans as 0/1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable, Iterator

import sqlite_utils

from gpudash.fmt import json_text
from gpudash.records import SAMPLE_TABLES

# Columns every sample row carries before the record's own fields.
KEY_COLUMNS = ("session_id", "tick")


@dataclass(frozen=True, slots=True)
class Column:
    """One record field as a column: its SQL affinity and how to encode/decode the Python value."""

    name: str
    py: type  # int, float, str, bool, or object (JSON)
    vocabulary: type | None = None  # a str enum (records.ServerState) the stored text is read back into

    @property
    def sql(self) -> type:
        """The type sqlite-utils maps to a column affinity (JSON and bool ride on str/int)."""
        return {bool: int, object: str}.get(self.py, self.py)


def _column_type(hint: Any) -> type:
    """The scalar type behind a hint such as ``float | None``; a str enum is stored as its text; ``Any``
    becomes object (stored as JSON)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0]
    if isinstance(base, type) and issubclass(base, str):
        return str
    return base if base in (int, float, bool) else object


def _vocabulary(hint: Any) -> type | None:
    base = ([a for a in typing.get_args(hint) if a is not type(None)] or [hint])[0]
    return base if isinstance(base, type) and issubclass(base, str) and base is not str else None


@cache
def columns(table: str) -> tuple[Column, ...]:
    """The record columns of a sample table, in dataclass field order."""
    cls = SAMPLE_TABLES[table]
    hints = typing.get_type_hints(cls)
    return tuple(Column(f.name, _column_type(hints[f.name]), _vocabulary(hints[f.name]))
                 for f in dataclasses.fields(cls))


# ---- the 1-minute tier (retention.py fills it) -------------------------------------------------------
BUCKET_S = 60
# Periodic sample tables that get a 1-minute tier; requests and events are sparse and stay as they are.
ROLLUP_TABLES = tuple(t for t in SAMPLE_TABLES if t not in ("requests", "events"))
# Integer columns that name a thing (a GPU, a process, a port) rather than measure it.
_ID_INTS = frozenset({"index", "gpu_index", "pid", "gpu", "via", "port"})
# Text columns that say how a thing was, not which thing it is: a minute's row keeps every value seen in
# the minute ("none,power cap"), where grouping by them would split one GPU's minute into several rows.
_STATUS_TEXT = frozenset({"throttle", "state"})
# Integer columns that are sets of flags (NVML's clock-event reasons): a minute's row keeps every flag seen in
# the minute (their OR), where a mean or a maximum of a bitmask means nothing.
_FLAG_INTS = frozenset({"clock_events"})
FLAG_BITS = 32


def rollup_table(table: str) -> str:
    return f"{table}_1m"


@cache
def rollup_split(table: str) -> tuple[tuple[Column, ...], tuple[Column, ...], tuple[Column, ...]]:
    """(identity, status, measured columns) of a sample table: text and id-like integers identify a row
    within a minute, status text is gathered (every value seen), every other number but a set of flags
    (rollup_flags) is averaged and maximized."""
    statuses = tuple(c for c in columns(table) if c.py is str and c.name in _STATUS_TEXT)
    keys = tuple(c for c in columns(table)
                 if (c.py is str and c not in statuses) or (c.py is int and c.name in _ID_INTS))
    nums = tuple(c for c in columns(table) if c.py in (int, float) and c not in keys and c.name != "ts"
                 and c.name not in _FLAG_INTS)
    return keys, statuses, nums


def rollup_flags(table: str) -> tuple[Column, ...]:
    """The flag columns of a sample table, OR-ed over a minute."""
    return tuple(c for c in columns(table) if c.py is int and c.name in _FLAG_INTS)


def rollup_schema(table: str) -> dict[str, type]:
    """Columns of `<table>_1m`: session, minute start, sample count, identity and status (in the record's
    order), then mean and max per number."""
    keys, statuses, nums = rollup_split(table)
    cols: dict[str, type] = {"session_id": int, "bucket": float, "n": int}
    cols.update({c.name: c.sql for c in columns(table) if c in keys or c in statuses or c in rollup_flags(table)})
    for c in nums:
        cols[c.name] = float
        cols[f"{c.name}_max"] = c.sql
    return cols


def encode_json(value: Any) -> str | None:
    """A free-form value (Event.old/new) as JSON text any parser reads (fmt.json_text: -Inf as null);
    None stays NULL."""
    return None if value is None else json_text(value, sort_keys=True)


def decode_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# ---- migrations -------------------------------------------------------------------------------------
# Each function takes the DB from version i to i+1. Never edit a released step; append a new one.

# The sample tables v1 made. Steps 1-5 work on these alone, so a file that stopped at any version takes
# the same path as one created then; a record kind added later gets a step of its own (v6: pool_samples).
_V1_TABLES = ("gpu_samples", "gpu_process_samples", "host_samples", "process_samples", "engine_path_samples",
              "pool_shard_samples", "server_samples", "requests", "events")


def _create_sample_table(db: sqlite_utils.Database, table: str) -> None:
    """A sample table with its record's columns, every row keyed by session and tick."""
    cols: dict[str, type] = {"session_id": int, "tick": int}
    cols.update({c.name: c.sql for c in columns(table)})
    db[table].create(cols, not_null=set(KEY_COLUMNS), foreign_keys=[("session_id", "sessions", "id")])


def _index_sample_table(db: sqlite_utils.Database, table: str) -> None:
    """The two indices every sample table carries (see v3)."""
    db[table].create_index(["session_id", "tick"], if_not_exists=True)
    db[table].create_index(["session_id", "ts"], if_not_exists=True)


def _create_rollup_table(db: sqlite_utils.Database, table: str) -> None:
    """A table's 1-minute tier, `<table>_1m`, indexed by session and minute."""
    db[rollup_table(table)].create(rollup_schema(table), not_null={"session_id", "bucket", "n"},
                                   foreign_keys=[("session_id", "sessions", "id")])
    db[rollup_table(table)].create_index(["session_id", "bucket"], if_not_exists=True)


def _v1_core_tables(db: sqlite_utils.Database) -> None:
    """Sessions and one table per sample kind (every row keyed by session and tick)."""
    db["sessions"].create(
        {"id": int, "started": float, "ended": float, "host": str, "version": str,
         "config": str, "source": str, "note": str},
        pk="id", not_null={"started", "source"},
    )
    for table in _V1_TABLES:
        _create_sample_table(db, table)


def _v2_ticks(db: sqlite_utils.Database) -> None:
    """One row per tick (time, sweep errors) so replay keeps empty ticks and errors; backfilled from samples."""
    db["ticks"].create({"session_id": int, "tick": int, "ts": float, "errors": str},
                       pk=("session_id", "tick"), not_null={"ts"},
                       foreign_keys=[("session_id", "sessions", "id")])
    union = " UNION ALL ".join(f"SELECT session_id, tick, ts FROM [{t}]" for t in _V1_TABLES)
    db.execute(f"INSERT OR IGNORE INTO ticks (session_id, tick, ts) "
               f"SELECT session_id, tick, min(ts) FROM ({union}) GROUP BY session_id, tick")


def _v3_indices(db: sqlite_utils.Database) -> None:
    """Indices for per-session time ranges (history, export) and tick order (replay)."""
    for table in _V1_TABLES:
        _index_sample_table(db, table)


def _v4_session_writer(db: sqlite_utils.Database) -> None:
    """The writing process (pid and its start time) per session, so a session whose writer died
    (kill -9, power loss) shows as interrupted rather than open forever."""
    db["sessions"].add_column("pid", int)
    db["sessions"].add_column("pid_started", float)


def _v5_minute_tier(db: sqlite_utils.Database) -> None:
    """The 1-minute tier: one `<table>_1m` per periodic sample table (means, maxima and counts)."""
    for table in ROLLUP_TABLES:
        if table in _V1_TABLES:
            _create_rollup_table(db, table)


def _v6_pool_samples(db: sqlite_utils.Database) -> None:
    """`pool_samples`: each pool's slab and unassigned bytes per tick, with its indices and 1-minute tier.
    Sessions recorded before have no rows there (their slabs were never read)."""
    _create_sample_table(db, "pool_samples")
    _index_sample_table(db, "pool_samples")
    _create_rollup_table(db, "pool_samples")


def _v7_energy(db: sqlite_utils.Database) -> None:
    """Energy (issue 44): each GPU's energy counter and how it was had (`gpu_samples.energy_j`, `energy_source`),
    and `server_energy_samples`, each server's joules and tokens per tick, with its indices and 1-minute tier.
    Sessions recorded before have NULL energy and no server energy rows."""
    added = {"gpu_samples": {"energy_j": float, "energy_source": str},
             rollup_table("gpu_samples"): {"energy_j": float, "energy_j_max": float, "energy_source": str}}
    for table, cols in added.items():  # (a file begun by this version's v1 has them already)
        for name, typ in cols.items():
            if name not in db[table].columns_dict:
                db[table].add_column(name, typ)
    _create_sample_table(db, "server_energy_samples")
    _index_sample_table(db, "server_energy_samples")
    _create_rollup_table(db, "server_energy_samples")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1_core_tables, _v2_ticks, _v3_indices,
                                                              _v4_session_writer, _v5_minute_tier,
                                                              _v6_pool_samples, _v7_energy]
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(Exception):
    """The DB was written by a newer gpudash than this one."""


def current_version(db: sqlite_utils.Database) -> int:
    if "schema_version" not in db.table_names():
        return 0
    row = db.execute("SELECT max(version) FROM schema_version").fetchone()
    return row[0] or 0


@contextlib.contextmanager
def immediate(db: sqlite_utils.Database) -> Iterator[sqlite_utils.Database]:
    """A write transaction that takes the write lock at BEGIN. A deferred one that reads first and then
    writes fails at once with "database is locked" when another connection committed meanwhile (WAL
    cannot upgrade a stale snapshot), instead of waiting out the busy timeout like this one does."""
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.conn.rollback()
        raise
    db.conn.commit()


def migrate(db: sqlite_utils.Database, target: int = SCHEMA_VERSION) -> int:
    """Apply the forward migrations up to `target` in one IMMEDIATE transaction (two processes opening a
    new file at once cannot both migrate it); returns the new version."""
    with immediate(db):
        db["schema_version"].create({"version": int, "applied": float}, pk="version", if_not_exists=True)
        version = current_version(db)
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"schema v{version} is newer than this gpudash's v{SCHEMA_VERSION}")
        for step in range(version, target):
            MIGRATIONS[step](db)
            db["schema_version"].insert({"version": step + 1, "applied": time.time()})
        if target == SCHEMA_VERSION:
            sync_columns(db)
    return current_version(db)


# The columns of the tables every query reads, as the migrations made them; another tool may drop one.
CORE_COLUMNS = {"sessions": ("id", "started", "ended", "host", "version", "config", "source", "note", "pid",
                             "pid_started"),
                "ticks": ("session_id", "tick", "ts", "errors")}


def missing_columns(db: sqlite_utils.Database) -> list[str]:
    """`table.column` of each core column the file lacks (a migrated gpudash file lacks none)."""
    return [f"{table}.{c}" for table, cols in CORE_COLUMNS.items() for c in cols
            if c not in db[table].columns_dict]


def sync_columns(db: sqlite_utils.Database) -> None:
    """Add record fields a table lacks (a record gained a field) as nullable columns, in the 1-minute
    tier too."""
    for table in SAMPLE_TABLES:
        have = set(db[table].columns_dict)
        for c in columns(table):
            if c.name not in have:
                db[table].add_column(c.name, c.sql)
    for table in ROLLUP_TABLES:
        have = set(db[rollup_table(table)].columns_dict)
        for name, typ in rollup_schema(table).items():
            if name not in have:
                db[rollup_table(table)].add_column(name, typ)
