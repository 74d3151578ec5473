"""TUI benchmark: the real `gpudash launch --sim 8xh20` in a real terminal (a private tmux server).

Measures, and prints beside the targets from the issue (ratio = measured / target, <= 1 is met):
  * time to first frame: process start -> the header is on screen (median of 3 starts)
  * key -> screen change: send-keys of a view key -> the new view is on screen (median and p95 of 20)
  * CPU share of the gpudash process at 2 Hz with 8 sim GPUs on the Overview (30 s) - with the sim
    rig's background load off (the dashboard's own cost: sampler, servers' supervision and /metrics
    scrape, UI) and on "light" (the sim engine really copying bytes in this process), the probe off and
    on (its HTTP client runs in this process; llama-server is a child process and is not counted) -
    beside the headless `gpudash record` at the same rate as the no-UI baseline.
Polling capture-pane every 10 ms bounds the resolution of the two latency figures (each poll ~3 ms).

--watch-runs N measures only pure watching (load off, probe off): gpudash's own CPU, median of N starts, and
the first frame, median of 3 (issue 46: a render change is measured before/after this way).

Run: .venv/bin/python benchmarks/bench_tui.py [--cpu-seconds 30] [--watch-runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

GPUDASH = Path(sys.executable).with_name("gpudash")
SOCKET = f"gpudash-bench-{uuid.uuid4().hex[:8]}"


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, "-f", "/dev/null", *args], check=True, capture_output=True,
                          text=True).stdout


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def wait_for(session: str, needle: str, timeout: float = 30.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if needle in screen(session):
            return time.perf_counter()
        time.sleep(0.01)
    raise RuntimeError(f"{needle!r} never appeared; screen:\n{screen(session)}")


def start(config: Path, session: str) -> tuple[float, int]:
    """Start gpudash in a fresh tmux session; returns (start time, pid of the gpudash process)."""
    cmd = f"exec env -u COLUMNS -u LINES {GPUDASH} --config {config} launch --sim 8xh20 --no-record"
    t0 = time.perf_counter()
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40", cmd)
    pid = int(tmux("list-panes", "-t", session, "-F", "#{pane_pid}").split()[0])
    return t0, pid


def stop(session: str, pid: int) -> None:
    tmux("send-keys", "-t", session, "q")
    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass
    subprocess.run(["tmux", "-L", SOCKET, "kill-session", "-t", session], capture_output=True)


def config_file(tmp: Path, probe: bool, load: str) -> Path:
    path = tmp / f"config-probe-{probe}-{load}.toml"
    path.write_text(f"[sampling]\ninterval_s = 0.5\n\n[sim]\nload = \"{load}\"\n\n[probe]\nenabled = {str(probe).lower()}\n")
    return path


def record_cpu_share(cfg: Path, db: Path, seconds: float) -> float:
    """The no-UI baseline: headless `gpudash record` on the same rig at the same rate."""
    proc = subprocess.Popen([str(GPUDASH), "--config", str(cfg), "record", "--sim", "8xh20", "--interval", "0.5",
                             "--db", str(db), "--quiet"])
    try:
        time.sleep(3)
        p = psutil.Process(proc.pid)
        c0, t0 = p.cpu_times(), time.perf_counter()
        time.sleep(seconds)
        c1, t1 = p.cpu_times(), time.perf_counter()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0)


def first_frame(cfg: Path, runs: int = 3) -> float:
    times = []
    for i in range(runs):
        session = f"ff{i}"
        t0, pid = start(cfg, session)
        times.append(wait_for(session, "SIM 8xh20") - t0)
        wait_for(session, "GPU7")  # let it finish starting before quitting
        stop(session, pid)
    return statistics.median(times)


def key_latency(cfg: Path, presses: int = 20) -> tuple[float, float]:
    session = "keys"
    _, pid = start(cfg, session)
    wait_for(session, "GPU7")
    lat = []
    for i in range(presses):
        key, needle = ("5", "Engine paths") if i % 2 == 0 else ("1", "host CPU")
        t0 = time.perf_counter()
        tmux("send-keys", "-t", session, key)
        lat.append(wait_for(session, needle) - t0)
        time.sleep(0.2)
    stop(session, pid)
    lat.sort()
    return statistics.median(lat), lat[int(0.95 * (len(lat) - 1))]


def cpu_share(cfg: Path, seconds: float) -> float:
    session = "cpu"
    _, pid = start(cfg, session)
    wait_for(session, "GPU7")
    time.sleep(3)  # past start-up (imports, server launch)
    proc = psutil.Process(pid)
    c0, t0 = proc.cpu_times(), time.perf_counter()
    time.sleep(seconds)
    c1, t1 = proc.cpu_times(), time.perf_counter()
    stop(session, pid)
    return ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0)


def watch_only(runs: int, seconds: float) -> None:
    """Pure watching (no sim load, no probe): the process's CPU, median of `runs` starts; the first frame."""
    with tempfile.TemporaryDirectory() as d:
        cfg = config_file(Path(d), False, "off")
        try:
            shares = [cpu_share(cfg, seconds) * 100 for _ in range(runs)]
            ff = first_frame(cfg)
        finally:
            subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
    print(f"host: {psutil.cpu_count()} cores, load average {', '.join(f'{x:.2f}' for x in psutil.getloadavg())}")
    print(f"pure watching, 8 sim GPUs @ 2 Hz, Overview at 120x40, {seconds:g} s each: gpudash's own CPU "
          f"{statistics.median(shares):.2f}% of a core, median of {runs} ({', '.join(f'{x:.2f}' for x in shares)})")
    print(f"time to first frame: {ff:.2f} s, median of 3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-seconds", type=float, default=30.0)
    ap.add_argument("--watch-runs", type=int, default=0, help="only pure watching: CPU over this many starts")
    args = ap.parse_args()
    if args.watch_runs:
        return watch_only(args.watch_runs, args.cpu_seconds)
    cpu_rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        quiet = config_file(tmp, False, "off")
        try:
            ff = first_frame(quiet)
            k50, k95 = key_latency(quiet)
            for probe, load in ((False, "off"), (False, "light"), (True, "light")):
                cfg = config_file(tmp, probe, load)
                tui = cpu_share(cfg, args.cpu_seconds)
                base = record_cpu_share(cfg, tmp / f"rec-{load}.db", args.cpu_seconds)
                cpu_rows.append((f"sim load {load}, probe {'on' if probe else 'off'}", tui, base))
        finally:
            subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
    print(f"host: {psutil.cpu_count()} cores, load average {', '.join(f'{x:.2f}' for x in psutil.getloadavg())}")
    print(f"{'metric':<44} {'target':>8} {'measured':>9} {'ratio':>6}")
    for name, target, got in (("time to first frame (s), median of 3", 1.5, ff),
                              ("key -> screen change (ms), median of 20", 100.0, k50 * 1000),
                              ("key -> screen change (ms), p95 of 20", 100.0, k95 * 1000)):
        print(f"{name:<44} {target:>8.1f} {got:>9.2f} {got / target:>6.2f}")
    print("\nCPU % of one core, 8 sim GPUs @ 2 Hz, Overview shown (target 10%)")
    print(f"{'setting':<30} {'launch (TUI)':>12} {'ratio/target':>12} {'record (no UI)':>14} {'TUI/record':>10}")
    for name, tui, base in cpu_rows:
        print(f"{name:<30} {tui * 100:>12.2f} {tui * 100 / 10:>12.2f} {base * 100:>14.2f} "
              f"{tui / base if base else float('nan'):>10.2f}")


if __name__ == "__main__":
    main()
