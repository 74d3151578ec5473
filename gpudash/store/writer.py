"""The batched store writer: the sampler's sink that never makes a tick wait on the disk.

Snapshots queue in memory (bounded in rows; a producer that outruns the disk waits: back-pressure) and
one thread with its own connection turns them into rows and inserts them with `executemany`, one
transaction per flush. A flush happens when `flush_interval_s` has passed, when `batch_rows` rows are
waiting, on `flush()` and on `close()`. Each flush is atomic, so a killed process leaves whole ticks.
With a `Retention`, the same thread applies it every `every_s` (first after one interval), between flushes.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

from gpudash.records import Snapshot
from gpudash.store import codec
from gpudash.store.retention import Retention, prune
from gpudash.store.store import StoreError, connect

log = logging.getLogger(__name__)


class StoreWriter:
    """Writes Snapshots of session `sid` into the SQLite file at `store_path` (already migrated by Store.open)."""

    def __init__(self, store_path: Path | str, sid: int, flush_interval_s: float = 1.0,
                 queue_max: int = 100_000, batch_rows: int = 20_000, retention: Retention | None = None):
        if flush_interval_s <= 0 or queue_max < 1:
            raise ValueError("flush_interval_s must be > 0 and queue_max >= 1")
        self.sid = sid
        self.flush_interval_s = flush_interval_s
        self.queue_max = queue_max
        self.batch_rows = min(batch_rows, queue_max)
        self.rows_written = 0
        self.ticks_written = 0
        self.flushes = 0
        self.error: BaseException | None = None
        self.retention = retention
        self._next_prune = time.monotonic() + (retention.every_s if retention else 0.0)
        self._db = connect(Path(store_path))
        self._cond = threading.Condition()
        self._pending: list[Snapshot] = []
        self._pending_rows = 0
        self._submitted = 0  # snapshots accepted
        self._done = 0  # snapshots committed
        self._flush_now = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"gpudash-store-writer-{sid}", daemon=True)
        self._thread.start()

    def submit(self, snap: Snapshot) -> None:
        """Queue one snapshot; blocks while `queue_max` rows are already waiting (back-pressure).

        Once the writer has failed (a full disk), snapshots are dropped without a word: the failure is
        told once, by `error` and `close()`, not once per tick."""
        n = codec.count_rows(snap)
        with self._cond:
            while self._pending and self._pending_rows + n > self.queue_max and not self._stopped():
                self._cond.wait()
            if self.error is not None:
                return
            self._raise_if_stopped()
            self._pending.append(snap)
            self._pending_rows += n
            self._submitted += 1
            if self._pending_rows >= self.batch_rows:
                self._cond.notify_all()

    __call__ = submit

    def flush(self) -> None:
        """Commit everything submitted so far, and wait until it is on disk."""
        with self._cond:
            target = self._submitted
            self._flush_now = True
            self._cond.notify_all()
            while self._done < target and self.error is None and self._thread.is_alive():
                self._cond.wait()
            self._raise_if_stopped(closing_ok=True)

    def close(self) -> None:
        """Flush what is queued, stop the thread and close the connection. Idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self._db.close()
        if self.error is not None:
            raise StoreError(f"the store writer failed: {self.error}") from self.error

    def _stopped(self) -> bool:
        return self._closing or self.error is not None

    def _raise_if_stopped(self, closing_ok: bool = False) -> None:
        if self.error is not None:
            raise StoreError(f"the store writer failed: {self.error}") from self.error
        if self._closing and not closing_ok:
            raise StoreError("the store writer is closed")

    def _run(self) -> None:
        deadline = time.monotonic() + self.flush_interval_s
        while True:
            with self._cond:
                while not (self._closing or self._flush_now or self._pending_rows >= self.batch_rows):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                closing = self._closing
            try:
                self._commit(self._take())
            except BaseException:  # noqa: BLE001 - kept in self.error, surfaced to producers and close()
                return
            if not closing:
                self._maybe_prune()
                if self.error is not None:
                    return
            deadline = time.monotonic() + self.flush_interval_s
            if closing:
                with self._cond:
                    if not self._pending:
                        return

    def _take(self) -> list[Snapshot]:
        """Everything queued, leaving the queue empty (producers blocked on a full queue may go on)."""
        with self._cond:
            batch, self._pending, self._pending_rows = self._pending, [], 0
            self._flush_now = False
            self._cond.notify_all()
        return batch

    def _commit(self, batch: list[Snapshot]) -> None:
        """Write `batch` and count it done; a failure is kept in `error` (and raised again)."""
        if batch:
            try:
                self._write(batch)
            except BaseException as err:
                with self._cond:
                    self.error = err
                    self._cond.notify_all()
                raise
        with self._cond:
            self._done += len(batch)
            self._cond.notify_all()

    def _maybe_prune(self) -> None:
        """Apply the retention policy when it is due, flushing the queue between the steps that give
        pages back (so samples wait for one step, not the whole prune); a failure of the prune is logged
        and tried again next interval (the samples matter more than the pruning)."""
        if self.retention is None or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + self.retention.every_s
        try:
            prune(self._db, self.retention, between=lambda: self._commit(self._take()))
        except BaseException as err:  # noqa: BLE001
            if self.error is not None:  # a flush between the steps failed: _run stops on it
                return
            if not isinstance(err, sqlite3.Error):
                raise
            log.warning("applying the retention policy failed (tried again in %g s): %s", self.retention.every_s, err)

    def _write(self, batch: list[Snapshot]) -> None:
        rows: dict[str, list[tuple]] = {}
        n = 0
        for snap in batch:
            n += codec.snapshot_rows(self.sid, snap, rows)
        conn = self._db.conn
        with self._db.atomic():
            for table, values in rows.items():
                conn.executemany(codec.TICK_SQL if table == "ticks" else codec.insert_sql(table), values)
        self.rows_written += n
        self.ticks_written += len(batch)
        self.flushes += 1
