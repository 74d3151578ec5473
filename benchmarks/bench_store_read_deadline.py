"""What the read deadline (gpudash/store/deadline.py) costs a reader: one session's gpu_samples streamed
row by row as export and replay read them, through a plain sqlite3 connection (the baseline, as readers
connected before), a DeadlineConnection not armed (the writer's) and one armed (history, export, replay).
A real SQLite file of 3000 ticks x 8 GPUs written by StoreWriter; best of --runs, alternating.

Run: PYTHONPATH=. python benchmarks/bench_store_read_deadline.py [--ticks 3000] [--runs 7]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import sqlite_utils

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "store"))
from store_samples import full_snapshot  # noqa: E402

from gpudash.config import Config  # noqa: E402
from gpudash.store import Store, StoreWriter  # noqa: E402
from gpudash.store.deadline import DeadlineConnection  # noqa: E402

QUERY = "SELECT * FROM gpu_samples WHERE session_id = ? ORDER BY tick, rowid"


def _db(path: Path, kind: str) -> sqlite_utils.Database:
    if kind == "baseline: sqlite3.Connection":
        return sqlite_utils.Database(sqlite3.connect(path))
    conn = sqlite3.connect(path, factory=DeadlineConnection)
    if kind.endswith("armed (readers)"):
        conn.arm()
    return sqlite_utils.Database(conn)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    path = Path(tempfile.mkdtemp()) / "g.db"
    with Store.open(path) as store:
        sid = store.begin_session("sim:h200", Config())
        writer = StoreWriter(store.path, sid)
        for t in range(args.ticks):
            writer.submit(full_snapshot(t, n_gpus=8))
        writer.close()
    kinds = ("baseline: sqlite3.Connection", "this: DeadlineConnection, not armed (writer)",
             "this: DeadlineConnection, armed (readers)")
    best = dict.fromkeys(kinds, float("inf"))
    rows = 0
    for _ in range(args.runs):
        for kind in kinds:
            db = _db(path, kind)
            start = time.perf_counter()
            rows = sum(1 for _ in db.query(QUERY, [sid]))
            best[kind] = min(best[kind], time.perf_counter() - start)
            db.close()
    base = best[kinds[0]]
    print(f"{'connection':<46}{'rows':>8}{'ms (best)':>11}{'vs baseline':>13}")
    for kind in kinds:
        print(f"{kind:<46}{rows:>8}{best[kind] * 1000:>11.1f}{best[kind] / base:>12.2f}x")


if __name__ == "__main__":
    main()
