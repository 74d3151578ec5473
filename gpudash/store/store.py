"""The SQLite store: open/migrate a DB file, sessions, and the queries history, export and replay use.

Samples arrive through `StoreWriter` (its own thread and connection); this class is for everything
else, from one thread. Direct writes (`record_event`, `insert_requests`) are for CLI tools writing a
session that no writer is filling: each call becomes a tick of its own so replay shows it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import socket
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import psutil
import sqlite_utils

from gpudash import outside
from gpudash.config import Config, to_toml
from gpudash.private_fs import private_dir, private_file
from gpudash.redact import mask_text, remember_config
from gpudash.records import SAMPLE_TABLES, Event, RequestSample, Snapshot
from gpudash.store import codec
from gpudash.store.deadline import READ_DEADLINE_S, DeadlineConnection
from gpudash.store.schema import (ROLLUP_TABLES, SchemaTooNew, immediate, migrate, missing_columns,
                                  rollup_table)

# The notes of the sessions that record what the dashboard shows (written by `launch`, `serve`, `record`);
# an empty note is a session from before notes. Bench runs, probes and server actions note themselves otherwise.
RECORDING_NOTES = ("gpudash launch", "gpudash serve", "gpudash record")
# Tables a session's rows live in, in export order.
SESSION_TABLES: tuple[str, ...] = ("sessions", "ticks", *SAMPLE_TABLES)
# The 1-minute tier (retention.py): a session's samples older than [store] raw_days live here.
TIER_TABLES: tuple[str, ...] = tuple(rollup_table(t) for t in ROLLUP_TABLES)
log = logging.getLogger(__name__)


class StoreError(ValueError):
    """A DB that cannot be used (not SQLite, newer schema, unknown session); the message says what to do."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One recording session with its row counts (for `gpudash history`)."""

    id: int
    started: float | None  # None only in a damaged row
    ended: float | None
    duration_s: float | None
    source: str
    host: str | None
    version: str | None
    note: str | None
    rows: dict[str, int] = field(default_factory=dict)
    state: str = "closed"
    """closed (ended), live (its writer runs), interrupted (its writer is gone), open (cannot tell:
    another host, or written before writers were noted), or damaged (its times are not numbers)."""
    damage: str | None = None
    """What is wrong with a damaged row, e.g. "started holds 'yesterday', not a time"."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpudash_version() -> str:
    try:
        return importlib.metadata.version("gpudash")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


BUSY_TIMEOUT_S = 10.0  # how long a connection waits for another's lock before "database is locked"


def connect(path: Path, new: bool = False, deadline_s: float | None = None) -> sqlite_utils.Database:
    """A connection tuned for this store: WAL (readers never block the writer), NORMAL sync (a killed
    process loses nothing committed), and a busy timeout so the writer and the CLI can share the file.
    A `new` file first gets incremental auto-vacuum, so prunes give pages back to the disk: SQLite takes
    that only before anything is written, and switching to WAL already writes the file. `deadline_s`: a
    statement that runs that long without a row is interrupted (store/deadline.py), for a file a reader
    was handed."""
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, check_same_thread=False, factory=DeadlineConnection)
    if deadline_s is not None:
        conn.arm(deadline_s)
    db = sqlite_utils.Database(conn, execute_plugins=False)
    if new:
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    _enable_wal(db)
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def _enable_wal(db: sqlite_utils.Database) -> None:
    """Switch to WAL, waiting out another connection that switches the same new file: SQLite answers that
    switch's "database is locked" at once, not after the busy timeout (two gpudash processes starting on
    one new file failed so about one time in ten)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.enable_wal()
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class Store:
    """A gpudash SQLite file, migrated to the current schema."""

    def __init__(self, db: sqlite_utils.Database, path: Path):
        self.db = db
        self.path = path

    @classmethod
    def open(cls, path: Path | str, writing: bool = True) -> Store:
        """Open (creating missing parent directories 0700 and a missing file 0600) and migrate forward.

        For `writing`, a read-only file is refused and SQLite's quick_check runs first, so nothing is
        appended to a damaged file; readers (history, export) skip that scan of the whole file and
        report damage where they meet it. A file that exists keeps its mode (private_fs.py), so a refused
        file, or another file reached through a symlink, is left exactly as it was.
        """
        p = Path(path).expanduser()
        if p.is_symlink() and not p.exists():
            raise StoreError(f"{p} is a symlink to {os.readlink(p)}, which does not exist; pass the database "
                             "file itself to --db")
        if p.is_dir():
            raise StoreError(f"{p} is a directory; pass a file path to --db")
        if p.exists() and not p.is_file():
            raise StoreError(f"{p} is not a regular file; pass a database file to --db")
        for what in (p, p.parent) if writing else ():
            if what.exists() and not os.access(what, os.W_OK):
                raise StoreError(f"{what} is read-only; make it writable or pass another --db")
        try:
            private_dir(p.parent)
            new = not p.exists() or p.stat().st_size == 0
            private_file(p)
            if not new:  # before the switch to WAL, which already changes the file
                _refuse_foreign(p)
            db = connect(p, new=new, deadline_s=None if writing else READ_DEADLINE_S)
            if writing and not new:  # before the migration, which would write into a damaged file
                problem = db.execute("PRAGMA quick_check(1)").fetchone()[0]
                if problem != "ok":
                    db.close()
                    raise StoreError(f"{p} is damaged ({problem}); gpudash will not add to it: move it aside "
                                     "(its readable sessions can still be exported) or pass another --db")
            migrate(db)
            missing = missing_columns(db)
            if missing:
                db.close()
                raise StoreError(f"{p} lacks the column{'s' * (len(missing) > 1)} {', '.join(missing)} (another "
                                 "tool changed its tables); gpudash cannot use it: pass another --db")
        except SchemaTooNew as err:
            raise StoreError(f"{p} was written by a newer gpudash ({err}); upgrade gpudash or pass another --db") from None
        except sqlite3.DatabaseError as err:
            raise StoreError(f"{p} is not a usable gpudash database ({err}); pass another file to --db") from None
        except OSError as err:
            raise StoreError(f"cannot create the database {p} ({err.strerror}); pass a writable path to --db") from None
        return cls(db, p)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sessions ----------------------------------------------------------------------------------

    def begin_session(self, source: str, config: Config, note: str = "") -> int:
        """A new session row: host, gpudash version, the effective config as TOML, and the source label.
        The config's secrets are remembered, so every text written into this file after is masked."""
        remember_config(config)
        me = psutil.Process()
        with immediate(self.db):  # sqlite_utils reads the table before it inserts: take the write lock first
            table = self.db["sessions"].insert({
                "started": time.time(), "ended": None, "host": socket.gethostname(), "version": gpudash_version(),
                "config": to_toml(config, redacted=True), "source": source, "note": mask_text(note),
                "pid": me.pid, "pid_started": me.create_time(),
            })
        return int(table.last_pk)

    def end_session(self, sid: int) -> bool:
        """Note the session's end; False (logged, not raised) when the disk refuses even that, since the
        caller is shutting down and `history` shows such a session as interrupted anyway."""
        try:
            with self.db.atomic():
                self.db.execute("UPDATE sessions SET ended = ? WHERE id = ?", [time.time(), sid])
        except sqlite3.Error as err:
            log.warning("could not note the end of session %d in %s: %s", sid, self.path, err)
            return False
        return True

    def sessions(self) -> list[SessionInfo]:
        """Every session with its row counts and state; StoreError when the file is damaged."""
        try:
            return self._sessions()
        except sqlite3.DatabaseError as err:
            raise StoreError(f"{self.path} cannot be read ({err}); it may be damaged: "
                             "`sqlite3 FILE .recover` can save what is readable") from None

    def _sessions(self) -> list[SessionInfo]:
        counts: dict[int, dict[str, int]] = {}
        for table in (*SESSION_TABLES[1:], *TIER_TABLES):
            for sid, n in self.db.execute(f"SELECT session_id, count(*) FROM [{table}] GROUP BY session_id"):
                counts.setdefault(sid, {})[table] = n
        out = []
        rows = self.db.query("SELECT s.*, (SELECT max(ts) FROM ticks t WHERE t.session_id = s.id) AS last_ts "
                             "FROM sessions s ORDER BY s.id")
        here = socket.gethostname()
        for r in rows:
            rc = {t: counts.get(r["id"], {}).get(t, 0) for t in SESSION_TABLES[1:]}
            rc.update({t: n for t in TIER_TABLES if (n := counts.get(r["id"], {}).get(t, 0))})
            times = {c: _time(r[c]) for c in ("started", "ended", "last_ts")}
            bad = [f"{c} holds {r[c]!r}, not a time" for c in ("started", "ended") if r[c] is not None and times[c] is None]
            start = times["started"]
            texts = [_text(r[c]) for c in ("source", "host", "version", "note")]
            if bad or start is None:  # text in a time column (another tool wrote it): shown, never raised
                out.append(SessionInfo(r["id"], start, None, None, str(texts[0]), *texts[1:], rc, "damaged",
                                       "; ".join(bad) or "started is empty"))
                continue
            end = times["ended"] or times["last_ts"] or start
            out.append(SessionInfo(r["id"], start, times["ended"], max(0.0, end - start), str(texts[0]),
                                   *texts[1:], rc, _state(r, here)))
        return out

    def session_row(self, sid: int) -> dict[str, Any]:
        rows = list(self.db.query("SELECT * FROM sessions WHERE id = ?", [sid]))
        if not rows:
            raise StoreError(f"no session {sid} in {self.path}; `gpudash history` lists the sessions")
        return rows[0]

    def resolve_session(self, ref: str | int, recording: bool = False) -> int:
        """A session id from ``"latest"`` or a number; ValueError (a StoreError) naming the fix if none.
        With `recording`, "latest" is the newest recording of the dashboard (RECORDING_NOTES), not a bench
        run, a probe or a server action written after it."""
        if str(ref).strip().lower() == "latest":
            where = f" WHERE coalesce(note, '') IN ('', {', '.join('?' * len(RECORDING_NOTES))})" if recording else ""
            row = self.db.execute(f"SELECT max(id) FROM sessions{where}", RECORDING_NOTES if recording else ()
                                  ).fetchone()
            if row[0] is None and recording and self.db.execute("SELECT count(*) FROM sessions").fetchone()[0]:
                raise StoreError(f"{self.path} holds no recording of the dashboard to replay (only bench runs, probes "
                                 "or server actions); record one with `gpudash record`, or name a session by its id "
                                 "(`gpudash history` lists them)")
            if row[0] is None:
                raise StoreError(f"{self.path} has no sessions yet; record one with `gpudash record`")
            return int(row[0])
        try:
            sid = int(str(ref).strip())
        except ValueError:
            raise StoreError(f"session must be a number or 'latest', got {ref!r}") from None
        if not 0 < sid < 2**63:  # SQLite integers end at 2**63 - 1
            raise StoreError(f"no session {sid} in {self.path}; `gpudash history` lists the sessions")
        self.session_row(sid)
        return sid

    # ---- reading -----------------------------------------------------------------------------------

    def rows(self, sid: int, table: str) -> Iterator[dict[str, Any]]:
        """A session's rows of one table as stored (sample tables in tick order)."""
        if table == "sessions":
            yield self.session_row(sid)
            return
        if table in TIER_TABLES:
            yield from self.db.query(f"SELECT * FROM [{table}] WHERE session_id = ? ORDER BY bucket, rowid", [sid])
            return
        if table not in SESSION_TABLES:
            raise StoreError(f"unknown table {table!r}; tables are {', '.join(SESSION_TABLES + TIER_TABLES)}")
        yield from self.db.query(f"SELECT * FROM [{table}] WHERE session_id = ? ORDER BY tick, rowid", [sid])

    def count(self, sid: int, table: str) -> int:
        if table == "sessions":
            return 1
        return self.db.execute(f"SELECT count(*) FROM [{table}] WHERE session_id = ?", [sid]).fetchone()[0]

    def snapshots(self, sid: int) -> Iterator[Snapshot]:
        """The session's Snapshots rebuilt tick by tick, with the recorded source label (sim stays sim)."""
        source = self.session_row(sid)["source"]
        cursors = {t: _TickRows(self.rows(sid, t)) for t in SAMPLE_TABLES}
        for tick in self.db.query("SELECT tick, ts, errors FROM ticks WHERE session_id = ? ORDER BY tick", [sid]):
            t = tick["tick"]
            fields: dict[str, Any] = {}
            for table, (attr, single) in codec.snapshot_fields().items():
                records = tuple(codec.decode(table, r) for r in cursors[table].take(t))
                fields[attr] = (records[0] if records else None) if single else records
            yield Snapshot(ts=tick["ts"], tick=t, source=source, errors=codec.tick_errors(sid, t, tick["errors"]),
                           **fields)

    # ---- direct writes -----------------------------------------------------------------------------

    def record_event(self, sid: int, event: Event) -> None:
        self._write_tick(sid, event.ts, "events", [event])

    def insert_requests(self, sid: int, requests: Iterable[RequestSample]) -> None:
        reqs = list(requests)
        if reqs:
            self._write_tick(sid, max(r.ts for r in reqs), "requests", reqs)

    def _write_tick(self, sid: int, ts: float, table: str, records: list[Any]) -> None:
        self.session_row(sid)
        enc = codec.encoder(table)
        with immediate(self.db):  # it reads the last tick, then writes: take the write lock first
            last = self.db.execute("SELECT max(tick) FROM ticks WHERE session_id = ?", [sid]).fetchone()[0]
            tick = 0 if last is None else last + 1
            self.db.execute(codec.TICK_SQL, [sid, tick, ts, None])
            self.db.conn.executemany(codec.insert_sql(table), [(sid, tick) + enc(r) for r in records])


def _refuse_foreign(path: Path) -> None:
    """StoreError when the SQLite file at `path` is not gpudash's: it holds tables but no schema_version
    (another application's database gains no gpudash tables and no WAL mode), or it holds a view or a
    trigger, which gpudash never makes (a `sessions` view that recurses for ever would hang every read, a
    trigger would run someone else's SQL on gpudash's writes). Read on a connection of its own that changes
    nothing, under the read deadline; a file that is not SQLite at all fails in the caller's except."""
    with contextlib.closing(sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, factory=DeadlineConnection)) as db:
        db.arm()
        objects = db.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                             "ORDER BY name").fetchall()
    tables = [name for kind, name in objects if kind == "table"]
    if tables and "schema_version" not in tables:
        shown = ", ".join(tables[:3]) + (f" and {len(tables) - 3} more" if len(tables) > 3 else "")
        raise StoreError(f"{path} is another application's SQLite database (tables {outside.printable(shown)}), "
                         "not gpudash's; gpudash leaves it as it is: pass another --db")
    if odd := next(((kind, name) for kind, name in objects if kind in ("view", "trigger")), None):
        raise StoreError(f"{path} holds a {odd[0]} named {outside.printable(str(odd[1]))!r}, which gpudash never "
                         "makes, so it is not a gpudash database as gpudash wrote it; pass another --db")


def _text(value: Any) -> str | None:
    """A text column's value as text: a BLOB or a number another tool put there becomes its text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def _time(value: Any) -> float | None:
    """A time column's value as a number; None when it is empty or not a number (text, a blob)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _state(row: dict[str, Any], here: str) -> str:
    """A session row's state: its writer is known by host, pid and that process's start time (a pid alone
    may have been reused by an unrelated process since)."""
    if row["ended"] is not None:
        return "closed"
    if row.get("pid") is None or row["host"] != here:
        return "open"
    try:
        alive = abs(psutil.Process(row["pid"]).create_time() - row["pid_started"]) < 1.0
    except (psutil.Error, TypeError, ValueError):  # gone, or a pid column holding text
        alive = False
    return "live" if alive else "interrupted"


class _TickRows:
    """Rows of one table in tick order, handed out one tick at a time (a merge cursor for `snapshots`)."""

    def __init__(self, rows: Iterator[dict[str, Any]]):
        self._rows = rows
        self._next: dict[str, Any] | None = next(rows, None)

    def take(self, tick: int) -> list[dict[str, Any]]:
        out = []
        while self._next is not None and self._next["tick"] <= tick:
            if self._next["tick"] == tick:
                out.append(self._next)
            self._next = next(self._rows, None)
        return out
