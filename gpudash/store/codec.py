"""Records <-> rows: how a Snapshot becomes INSERT parameters and how rows become records again.

The mapping from table to Snapshot field is read from `Snapshot`'s own type hints, so it cannot drift
from `records.py`. Encoding is a precomputed attrgetter per table (the writer's hot path).
"""

from __future__ import annotations

import logging
import operator
import typing
from functools import cache
from typing import Any, Callable

from gpudash.outside import printable
from gpudash.records import SAMPLE_TABLES, Snapshot
from gpudash.redact import mask_data, mask_text
from gpudash.store.schema import KEY_COLUMNS, columns, decode_json, encode_json

TICK_COLUMNS = ("session_id", "tick", "ts", "errors")
log = logging.getLogger(__name__)


@cache
def snapshot_fields() -> dict[str, tuple[str, bool]]:
    """table -> (Snapshot attribute, whether it holds one record rather than a tuple)."""
    by_class = {cls: table for table, cls in SAMPLE_TABLES.items()}
    out: dict[str, tuple[str, bool]] = {}
    for name, hint in typing.get_type_hints(Snapshot).items():
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and args and args[0] in by_class:
            out[by_class[args[0]]] = (name, False)
        elif any(a in by_class for a in args):
            out[by_class[next(a for a in args if a in by_class)]] = (name, True)
    missing = set(SAMPLE_TABLES) - set(out)
    if missing:
        raise RuntimeError(f"Snapshot has no field for tables {sorted(missing)}")
    return out


@cache
def insert_sql(table: str) -> str:
    names = KEY_COLUMNS + tuple(c.name for c in columns(table))
    cols = ", ".join(f"[{n}]" for n in names)
    return f"INSERT INTO [{table}] ({cols}) VALUES ({', '.join('?' * len(names))})"


TICK_SQL = "INSERT OR IGNORE INTO ticks (session_id, tick, ts, errors) VALUES (?, ?, ?, ?)"


@cache
def encoder(table: str) -> Callable[[Any], tuple]:
    """record -> its column values as a tuple (JSON for free-form fields), every text with its secrets
    masked (redact.mask_text: a server's error that echoes the API key, a URL with its password)."""
    cols = columns(table)
    get = operator.attrgetter(*(c.name for c in cols))
    if len(cols) == 1:
        single = get
        get = lambda r: (single(r),)  # noqa: E731
    json_at = [i for i, c in enumerate(cols) if c.py is object]
    text_at = [i for i, c in enumerate(cols) if c.py is str]

    def encode(record: Any) -> tuple:
        values = list(get(record))
        for i in json_at:
            values[i] = encode_json(mask_data(values[i]))
        for i in text_at:
            if values[i] is not None:
                values[i] = mask_text(values[i])
        return tuple(values)

    return encode


def snapshot_rows(sid: int, snap: Snapshot, out: dict[str, list[tuple]]) -> int:
    """Append the snapshot's rows (per table, tick row under "ticks") to `out`; returns rows added."""
    key = (sid, snap.tick)
    errors = encode_json(mask_data(snap.errors)) if snap.errors else None
    out.setdefault("ticks", []).append((sid, snap.tick, snap.ts, errors))
    n = 1
    for table, (attr, single) in snapshot_fields().items():
        value = getattr(snap, attr)
        if single:
            if value is None:
                continue
            value = (value,)
        if value:
            enc = encoder(table)
            out.setdefault(table, []).extend(key + enc(r) for r in value)
            n += len(value)
    return n


def count_rows(snap: Snapshot) -> int:
    """Rows a snapshot will become (tick row included): the unit of the writer's back-pressure."""
    n = 1 if snap.host is None else 2
    return n + sum(len(getattr(snap, attr)) for attr, single in snapshot_fields().values() if not single)


@cache
def _decoder(table: str) -> Callable[[dict[str, Any]], Any]:
    cls = SAMPLE_TABLES[table]
    cols = columns(table)
    bools = [c.name for c in cols if c.py is bool]
    jsons = [c.name for c in cols if c.py is object]
    words = [(c.name, getattr(c.vocabulary, "read", c.vocabulary)) for c in cols if c.vocabulary is not None]
    names = [c.name for c in cols]

    def decode(row: dict[str, Any]) -> Any:
        kw = {n: row.get(n) for n in names}
        for n in bools:
            if kw[n] is not None:
                kw[n] = bool(kw[n])
        for n in jsons:
            kw[n] = lenient_json(kw[n], table, row, n)
        for n, read in words:
            if kw[n] is not None:
                kw[n] = read(kw[n])
        return cls(**kw)

    return decode


def lenient_json(text: Any, table: str, row: dict[str, Any], column: str) -> Any:
    """A JSON column's value. Text that is not JSON (a damaged row, another tool's write) stays as its text
    and is named in a warning (table, session, tick, column): one such value must not make a whole session
    unreadable."""
    try:
        return decode_json(text)
    except (TypeError, ValueError, RecursionError):
        log.warning("%s row (session %s, tick %s): %s is not JSON (%s); kept as text", table, row.get("session_id"),
                    row.get("tick"), column, printable(str(text))[:80])
        return text


def decode(table: str, row: dict[str, Any]) -> Any:
    """A stored row (dict with at least the record's columns) as its record."""
    return _decoder(table)(row)


def tick_errors(sid: int, tick: int, text: Any) -> tuple[str, ...]:
    """A tick's errors as recorded (a JSON list of texts); anything else is kept as one error that names
    the table and row, so the tick still replays and says what was wrong."""
    value = lenient_json(text, "ticks", {"session_id": sid, "tick": tick}, "errors")
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(e, str) for e in value):
        return tuple(value)
    return (f"ticks row (session {sid}, tick {tick}): errors holds {printable(str(value))[:200]}, not a JSON list "
            "of texts",)
