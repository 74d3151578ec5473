"""Disk bytes per GPU-day of a recorder left running: everything raw, against the [store] retention policy.

A simulated week (sim values, written as fast as the writer takes them, timestamps spread over the last
`--days` days at `--interval` s) goes into two real SQLite files through the StoreWriter:

* raw: no retention, what a recorder kept before the policy existed (the baseline);
* policy: the default [store] policy (full resolution for raw_days = 1, then 1-minute means and maxima),
  applied after every simulated hour as a running recorder does (`prune_interval_s`), then `store vacuum`.

Printed: file bytes and bytes per GPU-day of each, the ratio policy / raw, and the 1-minute tier alone
(its pages, from SQLite's dbstat, per GPU-day it covers): what the file grows by per GPU-day once the
raw day is full.

Run: PYTHONPATH=. python benchmarks/bench_store_growth.py [--days 7] [--gpus 2] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import time
from pathlib import Path

from gpudash.config import Config, StoreConfig
from gpudash.records import GpuSample, HostSample, Snapshot
from gpudash.store import Store, StoreWriter
from gpudash.store.retention import Retention, prune, vacuum

DAY = 86400.0
HOUR = 3600.0


def snapshot(tick: int, ts: float, gpus: int, rng: random.Random) -> Snapshot:
    """One tick as a GPU box records it: per-GPU telemetry and the host row (sim values)."""
    g = tuple(GpuSample(ts, i, f"GPU-{i:08x}", "NVIDIA H20", round(rng.uniform(0, 100), 1),
                        rng.randrange(10**9, 96 * 2**30), 96 * 2**30, round(rng.uniform(60, 500), 1),
                        round(rng.uniform(30, 80), 1), 1980, rng.uniform(0, 5e10), rng.uniform(0, 5e10),
                        5, 16, 5, 16) for i in range(gpus))
    return Snapshot(ts, tick, "sim:8xh20", gpus=g, host=HostSample(ts, rng.uniform(0, 100), 2**35, 2**39, 2))


def record(path: Path, days: float, gpus: int, interval: float,
           policy: Retention | None) -> tuple[int, float, int | None]:
    """Write the simulated span into `path`; returns (file bytes, seconds it took, 1-minute tier bytes)."""
    t0 = time.perf_counter()
    store = Store.open(path)
    sid = store.begin_session("sim:8xh20", Config())
    rng = random.Random(1)
    start = time.time() - days * DAY
    ticks_per_hour = int(HOUR / interval)
    tick = 0
    for hour in range(int(days * 24)):
        writer = StoreWriter(path, sid, flush_interval_s=5.0)
        for _ in range(ticks_per_hour):
            writer.submit(snapshot(tick, start + tick * interval, gpus, rng))
            tick += 1
        writer.close()
        if policy is not None:
            prune(store.db, policy, now=start + (hour + 1) * HOUR)
    store.end_session(sid)
    if policy is not None:
        vacuum(store.db)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    try:
        tier = store.db.execute("SELECT sum(pgsize) FROM dbstat WHERE name LIKE '%\\_1m%' ESCAPE '\\'").fetchone()[0]
    except sqlite3.OperationalError:  # SQLite built without dbstat
        tier = None
    store.close()
    return path.stat().st_size, time.perf_counter() - t0, tier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between simulated ticks")
    a = ap.parse_args()
    policy = Retention.from_config(StoreConfig())
    gpu_days = a.gpus * a.days
    with tempfile.TemporaryDirectory() as d:
        raw, raw_s, _ = record(Path(d) / "raw.db", a.days, a.gpus, a.interval, None)
        kept, kept_s, tier = record(Path(d) / "policy.db", a.days, a.gpus, a.interval, policy)
    print(f"sim: {a.days:g} days x {a.gpus} GPUs at {a.interval:g} s "
          f"(policy: raw_days={policy.raw_s / DAY:g}, retain_days={policy.retain_s / DAY:g}, 1-minute tier)")
    print(f"{'store':<34}{'file bytes':>14}{'bytes/GPU-day':>16}{'ratio':>8}{'write s':>9}")
    print(f"{'raw, no retention (baseline)':<34}{raw:>14,}{raw / gpu_days:>16,.0f}{1.0:>8.2f}{raw_s:>9.1f}")
    print(f"{'[store] default policy + vacuum':<34}{kept:>14,}{kept / gpu_days:>16,.0f}{kept / raw:>8.3f}"
          f"{kept_s:>9.1f}")
    tier_days = a.gpus * (a.days - policy.raw_s / DAY)
    if tier is not None and tier_days > 0:
        print(f"{'  of which the 1-minute tier':<34}{tier:>14,}{tier / tier_days:>16,.0f}"
              f"{(tier / tier_days) / (raw / gpu_days):>8.3f}{'':>9}")


if __name__ == "__main__":
    main()
