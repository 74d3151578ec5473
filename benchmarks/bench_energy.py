"""Energy on the GPU machine (issue 44): J/token of the CUDA demo under the probe, and the energy counter
against power integrated at 10 Hz, on the card it runs on (NOT RUN yet: no GPU machine was lent when it was
written; run it there and commit the table with the card's name).

1. `gpudash serve` with no [[servers]] (the demo llama-server, CUDA where the box has its build, probed)
   for `--settle` s, then `--window` s more; each server's J per generated token and per 1,000 prompt tokens,
   tokens per kWh, busy and idle joules and the split, read back with `gpudash history --json` from the
   session it recorded. "this" is the checkout; "baseline" another gpudash tree (`--baseline DIR`).
2. GPU 0's energy counter against its board power read at 10 Hz and integrated, over `--window` s of that
   serving (the issue's goal: within 2%).

On a machine without an NVIDIA driver it refuses: a sim figure is never reported as a GPU one.

Run: PYTHONPATH=. python benchmarks/bench_energy.py [--settle 60] [--window 60] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRY = "from gpudash.cli import main; main()"


def counter_vs_power(seconds: float, hz: float = 10.0) -> tuple[str, float, float]:
    """(card, counter joules, power integrated at `hz`) of GPU 0 over `seconds`."""
    from gpudash.gpu.device import Device
    from gpudash.telemetry.energy import integrated_j

    dev = Device(0)
    readings = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        readings.append(dev.sample(time.time(), None, None))
        time.sleep(1.0 / hz)
    if readings[0].energy_j is None:
        return readings[0].name, float("nan"), integrated_j([(g.ts, g.power_w or 0.0) for g in readings])
    return (readings[0].name, readings[-1].energy_j - readings[0].energy_j,
            integrated_j([(g.ts, g.power_w or 0.0) for g in readings]))


def serve_energy(tree: Path, settle: float, window: float, tmp: Path) -> tuple[list[dict], tuple[str, float, float]]:
    """The demo served for settle + window s (`gpudash serve --no-sim`, the user's own cache, so the CUDA
    llama-server built there runs it): each server's energy over the session, and GPU 0's counter against
    integrated power over the window."""
    db = tmp / f"energy-{tree.name}-{time.monotonic_ns()}.db"
    cfg = tmp / "energy.toml"
    cfg.write_text('[sim]\nload = "off"\n')
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "--config", str(cfg), "serve", "--no-sim", "--quiet",
                             "--db", str(db)], env=env, cwd=tmp, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(settle)
        measured = counter_vs_power(window)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    out = subprocess.run([sys.executable, "-c", ENTRY, "history", "--db", str(db), "--json"], env=env,
                         capture_output=True, text=True, cwd=tmp, timeout=120, check=True)
    sessions = json.loads(out.stdout)
    return (sessions[-1]["energy"] if sessions else []), measured


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settle", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--baseline", type=Path, default=None)
    args = ap.parse_args()
    from gpudash.gpu import nvml

    reason = nvml.driver_available()
    if reason is not None:
        sys.exit(f"bench_energy measures real GPUs only ({reason}); run it on the GPU machine")
    trees = {"this": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    with tempfile.TemporaryDirectory() as d:
        results = {name: serve_energy(tree, args.settle, args.window, Path(d)) for name, tree in trees.items()}
    card = next(iter(results.values()))[1][0]
    print(f"gpudash serve (the demo, probed) on {card}: {args.settle:g} s settle + {args.window:g} s window")
    print(f"{'tree':10} {'server':12} {'J/token':>9} {'J/1k prompt':>12} {'tokens/kWh':>12} {'busy J':>10} "
          f"{'idle J':>10}")
    for name, (servers, _) in results.items():
        for s in servers:
            energy = s["busy_j"] + s["idle_j"]
            kprompt = 1000 * energy / s["prompt_tokens"] if s["prompt_tokens"] else float("nan")
            per_kwh = s["generation_tokens"] / (energy / 3.6e6) if energy else float("nan")
            print(f"{name:10} {s['server']:12} {s['j_per_token'] or float('nan'):9.4f} {kprompt:12.2f} "
                  f"{per_kwh:12.4g} {s['busy_j']:10.1f} {s['idle_j']:10.1f}")
    print(f"\n{'tree':10} {'counter J':>10} {'power@10Hz J':>13} {'diff':>8}   (goal: within 2%)")
    for name, (_, (_, counted, power)) in results.items():
        print(f"{name:10} {counted:10.1f} {power:13.1f} {(counted - power) / power:+8.2%}")


if __name__ == "__main__":
    main()
