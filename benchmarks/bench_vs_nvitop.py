"""CPU cost of watching: `gpudash launch` beside `nvitop`, both on the same real GPUs, in one run.

Each runs in its own terminal of the same size (a private tmux server) at a 1 s refresh; after a warm-up,
the CPU time of each app's own process is read over the same window (the llama-server that gpudash
supervises is a child process and is not counted; its /metrics scrape and supervision are, since they
run in gpudash). The table gives % of one core and gpudash / nvitop (the goal: at most 1.5). Needs NVIDIA GPUs and nvitop (`pip install nvitop`): on a machine without a driver
it says so and exits 2, since a simulated rig would measure something else.

Run: .venv/bin/python benchmarks/bench_vs_nvitop.py [--seconds 60] [--size 160x48]
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

# Both run as modules of this interpreter, so the comparison needs no console scripts on PATH.
GPUDASH = [sys.executable, "-m", "gpudash"]
NVITOP = [sys.executable, "-m", "nvitop"]
SOCKET = f"gpudash-vs-nvitop-{uuid.uuid4().hex[:8]}"
GOAL = 1.5  # gpudash may use at most this many times nvitop's CPU


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, "-f", "/dev/null", *args], check=True, capture_output=True,
                          text=True).stdout


def start(session: str, argv: list[str], size: tuple[int, int]) -> psutil.Process:
    cmd = "exec env -u COLUMNS -u LINES " + " ".join(argv)
    tmux("new-session", "-d", "-s", session, "-x", str(size[0]), "-y", str(size[1]), cmd)
    return psutil.Process(int(tmux("list-panes", "-t", session, "-F", "#{pane_pid}").split()[0]))


def cpu_s(proc: psutil.Process) -> float:
    """User + system seconds of the process itself (its threads included, its children not)."""
    t = proc.cpu_times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window (default 60)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring (default 10)")
    ap.add_argument("--size", default="160x48", help="terminal size for both (default 160x48)")
    args = ap.parse_args()
    size = tuple(int(x) for x in args.size.split("x"))
    if shutil.which("tmux") is None:
        sys.exit("bench_vs_nvitop: tmux is needed; install it")
    if importlib.util.find_spec("nvitop") is None:
        sys.exit("bench_vs_nvitop: nvitop is not importable here; pip install nvitop into this environment")
    from gpudash.telemetry.nvml import driver_available

    reason = driver_available()
    if reason is not None:
        print(f"bench_vs_nvitop: no NVIDIA GPUs ({reason}); this compares real GPU monitoring only", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.toml"
        cfg.write_text("[sampling]\ninterval_s = 1.0\n\n[probe]\nenabled = false\n")
        try:
            ours = start("gpudash", [*GPUDASH, "--config", str(cfg), "launch", "--no-sim", "--no-record"], size)
            theirs = start("nvitop", [*NVITOP, "--interval", "1"], size)
            time.sleep(args.warmup)
            c0 = (cpu_s(ours), cpu_s(theirs))
            t0 = time.perf_counter()
            time.sleep(args.seconds)
            c1 = (cpu_s(ours), cpu_s(theirs))
            wall = time.perf_counter() - t0
            screen = tmux("capture-pane", "-p", "-t", "gpudash")
        finally:
            subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
    g, n = ((b - a) / wall * 100 for a, b in zip(c0, c1))
    print(f"host: {psutil.cpu_count()} cores; both at a 1 s refresh in {size[0]}x{size[1]} terminals, "
          f"{args.seconds:g} s window after {args.warmup:g} s warm-up")
    if "real GPUs" not in screen:
        print("warning: gpudash's screen did not show 'real GPUs'; check the run", file=sys.stderr)
    print(f"{'tool':<10} {'CPU % of one core':>18} {'ratio to nvitop':>16}")
    print(f"{'nvitop':<10} {n:>18.2f} {1.0:>16.2f}")
    print(f"{'gpudash':<10} {g:>18.2f} {g / n if n else float('nan'):>16.2f}   (goal <= {GOAL:g})")


if __name__ == "__main__":
    main()
