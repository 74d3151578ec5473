"""Export one session to files: one per table, in CSV, JSON or Parquet.

One file per table, plus one per 1-minute tier table where retention has folded old samples into it.
Every file carries the session's `source` column, so a simulated session stays labelled `sim:<profile>`
wherever its rows travel. Nothing is written until every check has passed (no existing files unless
`force`, pyarrow importable for Parquet, a writable directory). Every file is written beside its target
first, under unpredictable names (private_fs.Pending: a name planted there is never followed); they are
renamed into place only once all are complete, and a failure half-way (a damaged DB, a full disk) removes
them all. Files are 0600, a directory the export creates 0700.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import sqlite3
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, TextIO

import tomli_w

from gpudash.fmt import json_text
from gpudash.private_fs import Pending, private_dir
from gpudash.records import SAMPLE_TABLES
from gpudash.redact import mask_data, mask_text, redact_config_data, redact_spec
from gpudash.store.schema import columns, encode_json
from gpudash.store.store import SESSION_TABLES, TIER_TABLES, Store

log = logging.getLogger(__name__)
FORMATS = ("csv", "json", "parquet")
_PARQUET_BATCH = 50_000


class ExportError(ValueError):
    """An export that cannot start; the message says how to fix it. Nothing was written."""


@dataclass(frozen=True, slots=True)
class Exported:
    table: str
    path: Path
    rows: int


def export_session(store: Store, sid: int, fmt: str, out_dir: Path, force: bool = False) -> list[Exported]:
    """Write every table of session `sid` into `out_dir` as `<table>.<fmt>`; returns what was written."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    source = store.session_row(sid)["source"]
    writer = _WRITERS[fmt](source)  # only the chosen format's writer is built: csv and json need no pyarrow
    tables = [*SESSION_TABLES, *(t for t in TIER_TABLES if store.count(sid, t))]  # the 1-minute tier if it holds any
    targets = {t: out_dir / f"{t}.{fmt}" for t in tables}
    existing = [p for p in targets.values() if p.exists()]
    if existing and not force:
        raise ExportError(f"{len(existing)} export file(s) already exist in {out_dir} (e.g. {existing[0].name}); "
                          f"pass --force to overwrite them or choose another --out")
    try:
        private_dir(out_dir)
    except OSError as err:
        raise ExportError(f"cannot create {out_dir} ({err.strerror}); choose a writable --out") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write into {out_dir} (permission denied); choose a writable --out")
    done: list[Exported] = []
    pending: list[Pending] = []
    try:
        for table, target in targets.items():
            pending.append(new := Pending(target))
            rows = writer(new, table, _header(store, table), _labelled(store.rows(sid, table), source, table))
            done.append(Exported(table, target, rows))
    except (OSError, sqlite3.DatabaseError) as err:
        for new in pending:
            new.discard()
        if isinstance(err, OSError):
            raise ExportError(f"cannot write the export into {out_dir} ({err.strerror or err}); "
                              "free some space or choose another --out; nothing was written") from None
        raise ExportError(f"{store.path} cannot be read ({err}); it may be damaged: `sqlite3 FILE .recover` can "
                          "save what is readable; nothing was written") from None
    except BaseException:
        for new in pending:
            new.discard()
        raise
    for new in pending:  # all or nothing: the files appear only once every one is complete
        new.commit()
    return done
    return done


def _header(store: Store, table: str) -> list[tuple[str, type]]:
    """(column, python type) in file order: the table's columns with `source` after the session key."""
    bools = {c.name for c in columns(table) if c.py is bool} if table in SAMPLE_TABLES else set()
    sql = {"INTEGER": int, "REAL": float, "FLOAT": float, "TEXT": str}
    cols = [(c.name, bool if c.name in bools else sql.get(c.type.upper(), str)) for c in store.db[table].columns]
    if table != "sessions":
        cols.insert(1, ("source", str))
    return cols


def _labelled(rows: Iterator[dict[str, Any]], source: str, table: str) -> Iterator[dict[str, Any]]:
    """Rows with the source label, booleans as booleans, a BLOB (another tool's) as hex text, and secrets
    masked: a server spec's env and flags, the secrets this process knows and any URL's credentials in
    every text (a DB may predate masking)."""
    bools = [c.name for c in columns(table) if c.py is bool] if table in SAMPLE_TABLES else []
    jsons = ({c.name for c in columns(table) if c.py is object} if table in SAMPLE_TABLES
             else {"errors"} if table == "ticks" else set())
    for row in rows:
        for col, value in row.items():
            if isinstance(value, bytes):
                row[col] = value = value.hex()
            if col == "config" and table == "sessions" and value:
                row[col] = _redacted_toml(value)
            elif col in jsons and value:
                row[col] = _redacted_json(value)
            elif isinstance(value, str):
                row[col] = mask_text(value)
        if table != "sessions":
            row["source"] = source
        for b in bools:
            if row[b] is not None:
                row[b] = bool(row[b])
        yield row


def _redacted_toml(text: str) -> str:
    """A session's config with every server's env and flags masked, and every other secret in its values."""
    try:
        return tomli_w.dumps(mask_data(redact_config_data(tomllib.loads(text))))
    except (tomllib.TOMLDecodeError, TypeError, ValueError):
        return mask_text(text)


def _redacted_json(text: Any) -> Any:
    """A JSON column (an event's old/new, a tick's errors) with a server spec's env and flags masked and
    every string in it through mask_text; text that is not JSON is masked as text."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return mask_text(text) if isinstance(text, str) else text
    return encode_json(mask_data(redact_spec(value) if isinstance(value, dict) else value))


@contextlib.contextmanager
def _text(new: Pending, newline: str | None = None) -> Iterator[TextIO]:
    """The pending file as UTF-8 text; left open for the commit (fsync, rename) that follows."""
    f = io.TextIOWrapper(new.file, encoding="utf-8", newline=newline)
    try:
        yield f
    finally:
        f.flush()
        f.detach()


def _write_csv(new: Pending, table: str, header: list[tuple[str, type]], rows: Iterator[dict[str, Any]]) -> int:
    n = 0
    with _text(new, newline="") as f:
        w = csv.DictWriter(f, fieldnames=[c for c, _ in header])
        w.writeheader()
        for row in rows:
            w.writerow(row)
            n += 1
    return n


def _write_json(new: Pending, table: str, header: list[tuple[str, type]], rows: Iterator[dict[str, Any]]) -> int:
    """A JSON array of row objects, streamed one row a line so a long session never sits in memory."""
    n = 0
    names = [c for c, _ in header]
    with _text(new) as f:
        f.write("[")
        for row in rows:
            f.write(",\n" if n else "\n")
            f.write(json_text({k: row.get(k) for k in names}))  # -Inf as null: every parser reads it
            n += 1
        f.write("\n]\n")
    return n


def _parquet_writer(source: str):
    """The Parquet writer, or ExportError naming the extra when pyarrow is not installed. Every file's
    metadata carries the session's source (`gpudash.source`), so an empty table's file is labelled too."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError("Parquet export needs pyarrow; install it with: pip install 'gpudash[parquet]'") from None
    types = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}

    def write(new: Pending, table: str, header: list[tuple[str, type]], rows: Iterator[dict[str, Any]]) -> int:
        schema = pa.schema([(c, types[t]) for c, t in header], metadata={"gpudash.source": source})
        n = 0
        with pq.ParquetWriter(new.name_for_library, schema) as w:
            batch: list[dict[str, Any]] = []
            for row in rows:
                batch.append(_fitted(row, header, table))
                if len(batch) >= _PARQUET_BATCH:
                    w.write_table(pa.Table.from_pylist(batch, schema=schema))
                    n, batch = n + len(batch), []
            if batch or n == 0:
                w.write_table(pa.Table.from_pylist(batch, schema=schema))
                n += len(batch)
        return n

    return write


def _fitted(row: dict[str, Any], header: list[tuple[str, type]], table: str) -> dict[str, Any]:
    """A row whose values fit Parquet's typed columns. SQLite lets another tool put text in a number column
    (started = 'yesterday'): such a value is written as null and the row named as damaged, on stderr,
    rather than ending the export (CSV and JSON carry the value as it is)."""
    for col, kind in header:
        value = row.get(col)
        fits = isinstance(value, int) if kind is int else isinstance(value, (int, float)) or kind is str
        if value is not None and not fits:
            log.warning("export: %s row %s is damaged: %s holds %r, not a number; written as null", table,
                        row.get("id", row.get("tick", "?")), col, value)
            row[col] = None
    return row


_WRITERS = {"csv": lambda _: _write_csv, "json": lambda _: _write_json, "parquet": _parquet_writer}
