"""What the demo costs once its figures are in (issue 36 item 6, the probe's part): `gpudash serve` with no
[[servers]] (the demo llama-server, probed), the first minute left to pass (the probe's burst), then the
user+system CPU of the demo llama-server and of gpudash's own process over a window, read with psutil, in
percent of one core; medians of several runs. "this" is the checkout; "baseline" another gpudash tree
(`--baseline DIR`, as bench_attach_cost.py takes it). The goal counts the demo llama-server and what the
probe adds to gpudash (gpudash with the probe on, less the same run with `[probe] enabled = false`).

Run: PYTHONPATH=. python benchmarks/bench_demo_probe.py [--runs 3] [--settle 60] [--window 60] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_attach_cost import cpu_shares, gpudash_run

REPO = Path(__file__).resolve().parents[1]
TARGET_PCT = 5.0


def run(tree: Path, probe: bool, settle: float, window: float, tmp: Path) -> tuple[float, float]:
    """(demo llama-server %, gpudash %) over `window` s, after `settle` s of serving."""
    cfg = f'[sim]\nload = "off"\n[probe]\nenabled = {"true" if probe else "false"}\n'
    with gpudash_run(tree, "serve", cfg, tmp) as me:
        time.sleep(settle)
        (server,) = [c for c in me.children(recursive=True) if "llama-server" in " ".join(c.cmdline())]
        server_pct, gpudash_pct = cpu_shares([server, me], window)
        return server_pct, gpudash_pct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--baseline", type=Path, default=None)
    args = ap.parse_args()
    trees = {"this": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    got: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.runs):
            for name, tree in trees.items():
                for probe in (True, False):
                    got.setdefault((name, probe), []).append(run(tree, probe, args.settle, args.window, Path(d)))
    print(f"gpudash serve --sim h200 with the demo llama-server; after {args.settle:g} s, {args.window:g} s windows, "
          f"{args.runs} runs, medians, % of one core")
    print(f"{'tree':10} {'probe':>6} {'llama-server':>13} {'gpudash':>8} {'demo cost':>10}")
    cost = {}
    for name in trees:
        server_on = statistics.median(s for s, _ in got[(name, True)])
        gd_on = statistics.median(g for _, g in got[(name, True)])
        gd_off = statistics.median(g for _, g in got[(name, False)])
        server_off = statistics.median(s for s, _ in got[(name, False)])
        cost[name] = server_on + (gd_on - gd_off)
        print(f"{name:10} {'on':>6} {server_on:13.2f} {gd_on:8.2f} {cost[name]:10.2f}")
        print(f"{name:10} {'off':>6} {server_off:13.2f} {gd_off:8.2f}")
    if "baseline" in cost and cost["this"] > 0:
        print(f"demo cost (llama-server + what the probe adds to gpudash), baseline / this: "
              f"{cost['baseline'] / cost['this']:.1f}x")
    print(f"goal: at most {TARGET_PCT:g} % of a core after the first minute: "
          f"{'met' if cost['this'] <= TARGET_PCT else 'NOT met'} ({cost['this']:.2f} %)")


if __name__ == "__main__":
    main()
