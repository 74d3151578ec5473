"""CPU share of `gpudash record` as a real process, measured with psutil (medians of several runs).

Each run starts `gpudash record --sim PROFILE --interval I --quiet` in a subprocess, waits until it has
written ticks (start-up and imports excluded), then reads the process's user+system CPU time over a
window: share = CPU seconds / wall seconds, in percent of one core. `[sim] load = "off"` isolates the
cost of recording; the "light" rows add the sim rig's background copies (simulated traffic through
the engine's sim backend, which a real GPU box does not pay), reported separately and labelled sim.

Run: PYTHONPATH=. python benchmarks/bench_record.py [--runs 3] [--window 20] [--profile 8xh20]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
TARGET_1HZ_PCT = 1.0


def _ticks(db: Path) -> int:
    try:
        conn = sqlite3.connect(db, timeout=5)
        try:
            return conn.execute("SELECT count(*) FROM ticks").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def measure(profile: str, interval: float, load: str, window: float) -> tuple[float, int]:
    """(CPU % of one core over `window` seconds, ticks recorded in the window)."""
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "c.toml"
        cfg.write_text(f'[sim]\nload = "{load}"\n')
        db = Path(d) / "r.db"
        env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CONFIG_HOME=d, XDG_DATA_HOME=d)
        proc = subprocess.Popen([sys.executable, "-c", "from gpudash.cli import main; main()", "--config", str(cfg),
                                 "record", "--sim", profile, "--interval", str(interval), "--db", str(db), "--quiet"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while _ticks(db) < 2:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"gpudash record did not start: {proc.stderr.read() if proc.stderr else ''}")
                time.sleep(0.1)
            p = psutil.Process(proc.pid)
            c0, w0, t0 = sum(p.cpu_times()[:2]), time.monotonic(), _ticks(db)
            time.sleep(window)
            c1, w1, t1 = sum(p.cpu_times()[:2]), time.monotonic(), _ticks(db)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return 100.0 * (c1 - c0) / (w1 - w0), t1 - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured per run")
    ap.add_argument("--profile", default="8xh20")
    args = ap.parse_args()
    cases = [(1.0, "off"), (10.0, "off"), (1.0, "light")]
    print(f"gpudash record --sim {args.profile}: CPU share of one core, median of {args.runs} runs of "
          f"{args.window:g} s (psutil user+system of the real process; {psutil.cpu_count()} cores here)")
    print(f"{'rate':>6} {'[sim] load':>11} {'CPU % (median)':>15} {'min..max':>13} {'ticks/run':>10} "
          f"{'target':>8} {'ratio':>7}")
    for hz, load in cases:
        samples = [measure(args.profile, 1.0 / hz, load, args.window) for _ in range(args.runs)]
        pcts = [s[0] for s in samples]
        med = statistics.median(pcts)
        target = f"{TARGET_1HZ_PCT:.1f}%" if hz == 1.0 and load == "off" else "-"
        ratio = f"{med / TARGET_1HZ_PCT:.2f}x" if target != "-" else "-"
        print(f"{hz:5g}Hz {load:>11} {med:14.2f}% {min(pcts):6.2f}..{max(pcts):<6.2f} "
              f"{statistics.median(s[1] for s in samples):10g} {target:>8} {ratio:>7}")


if __name__ == "__main__":
    main()
