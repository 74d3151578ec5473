"""Store writer throughput and DB size, printed as tables (medians of several runs).

1. Rows/s: StoreWriter (queue -> writer thread -> executemany, one transaction per flush) against a
   plain `executemany` of already-encoded tuples into the same schema in one transaction (the floor a
   writer can approach) and against sqlite-utils `insert_all` of row dicts (the obvious way); and the
   encoding alone (records to tuples, every text's secrets masked), which the writer does before SQLite.
2. DB bytes per GPU-hour: an 8-GPU session at 1 Hz for one simulated hour (GPU + host rows, and with
   two engine path rows per GPU as a sim rig with an engine records them).

Run: PYTHONPATH=. python benchmarks/bench_store.py [--runs 5] [--ticks 20000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from gpudash.config import Config
from gpudash.records import EnginePathSample, GpuSample, HostSample, Snapshot, as_row
from gpudash.store import Store, StoreWriter
from gpudash.store import codec

GPUS = 8


def snapshot(tick: int, rng: random.Random, paths: bool) -> Snapshot:
    ts = 1_700_000_000.0 + tick
    gpus = tuple(GpuSample(ts, i, f"GPU-{i:08x}", "NVIDIA H20", round(rng.uniform(0, 100), 1),
                           rng.randrange(10**9, 96 * 2**30), 96 * 2**30, round(rng.uniform(60, 500), 1),
                           round(rng.uniform(30, 80), 1), 1980, rng.uniform(0, 5e10), rng.uniform(0, 5e10),
                           5, 16, 5, 16, 128 * 2**30, 8 * 2**20) for i in range(GPUS))
    eng = tuple(EnginePathSample(ts, f"direct:{i}", i, None, d, tick * 10**9, tick * 300, rng.randrange(3),
                                 rng.uniform(0, 50), tick * 0.01)
                for i in range(GPUS) for d in ("h2d", "d2h")) if paths else ()
    return Snapshot(ts, tick, "sim:8xh20", gpus=gpus, host=HostSample(ts, rng.uniform(0, 100), 2**35, 2**39, 2),
                    engine_paths=eng)


def _new_session(dirpath: Path, name: str) -> tuple[Store, int]:
    store = Store.open(dirpath / name)
    return store, store.begin_session("sim:8xh20", Config())


def run_writer(dirpath: Path, snaps: list[Snapshot]) -> float:
    store, sid = _new_session(dirpath, "writer.db")
    writer = StoreWriter(store.path, sid)
    t0 = time.perf_counter()
    for s in snaps:
        writer.submit(s)
    writer.close()  # returns once every row is committed
    dt = time.perf_counter() - t0
    store.close()
    return dt


def run_executemany(dirpath: Path, snaps: list[Snapshot]) -> float:
    store, sid = _new_session(dirpath, "plain.db")
    rows: dict[str, list[tuple]] = {}
    for s in snaps:  # encoding is outside the timed region: this is the bare insert cost
        codec.snapshot_rows(sid, s, rows)
    t0 = time.perf_counter()
    with store.db.atomic():
        for table, values in rows.items():
            store.db.conn.executemany(codec.TICK_SQL if table == "ticks" else codec.insert_sql(table), values)
    dt = time.perf_counter() - t0
    store.close()
    return dt


def run_insert_all(dirpath: Path, snaps: list[Snapshot]) -> float:
    store, sid = _new_session(dirpath, "utils.db")
    t0 = time.perf_counter()
    with store.db.atomic():
        for table, attr in (("gpu_samples", "gpus"), ("engine_path_samples", "engine_paths")):
            store.db[table].insert_all(({"session_id": sid, "tick": s.tick, **as_row(r)}
                                        for s in snaps for r in getattr(s, attr)), batch_size=1000)
        store.db["host_samples"].insert_all(({"session_id": sid, "tick": s.tick, **as_row(s.host)} for s in snaps),
                                            batch_size=1000)
        store.db["ticks"].insert_all(({"session_id": sid, "tick": s.tick, "ts": s.ts} for s in snaps),
                                     batch_size=1000)
    dt = time.perf_counter() - t0
    store.close()
    return dt


def run_encode(snaps: list[Snapshot]) -> float:
    """Records to row tuples alone (the writer thread's CPU before SQLite), every text masked (redact)."""
    rows: dict[str, list[tuple]] = {}
    t0 = time.perf_counter()
    for s in snaps:
        codec.snapshot_rows(1, s, rows)
    return time.perf_counter() - t0


def bytes_per_gpu_hour(dirpath: Path, paths: bool) -> float:
    rng = random.Random(1)
    store, sid = _new_session(dirpath, f"size-{paths}.db")
    writer = StoreWriter(store.path, sid)
    for t in range(3600):  # one hour at 1 Hz
        writer.submit(snapshot(t, rng, paths))
    writer.close()
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.db.execute("VACUUM")
    empty_store, _ = _new_session(dirpath, f"empty-{paths}.db")
    empty = empty_store.path.stat().st_size
    size = store.path.stat().st_size
    store.close()
    empty_store.close()
    return (size - empty) / GPUS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ticks", type=int, default=20_000, help="snapshots per run (8 GPU + host + 16 path rows each)")
    args = ap.parse_args()
    rng = random.Random(0)
    snaps = [snapshot(t, rng, paths=True) for t in range(args.ticks)]
    rows = sum(codec.count_rows(s) for s in snaps)
    results: dict[str, list[float]] = {"StoreWriter (thread, batched)": [], "plain executemany (pre-encoded)": [],
                                       "sqlite-utils insert_all (dicts)": []}
    runners = dict(zip(results, (run_writer, run_executemany, run_insert_all)))
    for _ in range(args.runs):
        for name, fn in runners.items():
            with tempfile.TemporaryDirectory() as d:
                results[name].append(fn(Path(d), snaps))
    base = rows / statistics.median(results["plain executemany (pre-encoded)"])
    print(f"Store write throughput: {args.ticks} ticks, {rows} rows per run, median of {args.runs} runs")
    print(f"{'method':34} {'median s':>9} {'rows/s':>12} {'vs executemany':>15}")
    for name, times in results.items():
        rps = rows / statistics.median(times)
        print(f"{name:34} {statistics.median(times):9.3f} {rps:12,.0f} {rps / base:14.2f}x")
    encode = statistics.median(run_encode(snaps) for _ in range(args.runs))
    print(f"{'of which encoding (texts masked)':34} {encode:9.3f} {rows / encode:12,.0f} {'':>15}")
    print("target: StoreWriter >= 100,000 rows/s")
    print()
    print("DB size, 8 GPUs at 1 Hz for one hour (after checkpoint + VACUUM, minus an empty DB)")
    print(f"{'rows per tick':40} {'bytes per GPU-hour':>20} {'MB per GPU-day':>15}")
    with tempfile.TemporaryDirectory() as d:
        for paths, label in ((False, "8 GPU + 1 host + tick"), (True, "8 GPU + 1 host + 16 engine paths + tick")):
            b = bytes_per_gpu_hour(Path(d), paths)
            print(f"{label:40} {b:20,.0f} {b * 24 / 1e6:15.1f}")


if __name__ == "__main__":
    main()
