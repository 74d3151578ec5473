"""Staging against the driver for one pageable copy, size by size, with and without the preload.

In a PyTorch process with and without the transfer engine inside it (libgpudash_preload.so): the
crossover that the `h2d_staging_bytes` and `d2h_staging_bytes` knobs default to.

Per size (256 KiB to 64 MiB) and direction, `--mib` MiB of synchronous pageable copies as PyTorch makes
them: H2D `dev.copy_(host)` from pageable tensors already written (a state dict's `.to("cuda")`), D2H
`host.copy_(dev)` into pageable tensors already written (a buffer reused). The host side walks over a
`--span` MiB tensor, so a small size is not timed out of the caches. Each round runs one fresh process
without the preload and one with it, taking turns; the preloaded runs stage every pageable copy
(h2d_staging_bytes=0, d2h_staging_bytes=0) unless `--knob` says otherwise. The table gives medians of
GB/s and of process CPU per GB (user + system, every thread), and the crossover: the smallest size
from which staging is faster at every larger size. Every size's last copy is checked byte for byte.

Run: python benchmarks/bench_preload_sizes.py [--rounds 3] [--mib 512] [--span 256] [--knob k=v ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

KiB, MiB, GB = 2**10, 2**20, 1e9
SIZES = (256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB)
ALWAYS_STAGE = ["h2d_staging_bytes=0", "d2h_staging_bytes=0"]


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(fn: Any) -> tuple[float, float]:
    """(seconds, process CPU seconds) of fn(), the device idle before and after."""
    import torch

    torch.cuda.synchronize()
    c0, t0 = _cpu_s(), time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, _cpu_s() - c0


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.cuda.init()
    warm = torch.ones(64 << 20, dtype=torch.uint8)
    assert torch.equal(warm.cuda().cpu(), warm)  # starts the preloaded engine
    if os.environ.get("LD_PRELOAD"):
        time.sleep(0.3)
    span = args.span * MiB
    # every 8-byte word holds its own index: a misplaced or missing piece shows
    ref = torch.arange(span // 8, dtype=torch.int64, device="cuda").view(torch.uint8)
    host = torch.arange(span // 8, dtype=torch.int64).view(torch.uint8)
    back = torch.zeros(span, dtype=torch.uint8)  # D2H destinations, written once: faulted in
    out: dict[str, Any] = {"h2d": {}, "d2h": {}, "exact": True}
    for size in SIZES:
        count, slots = max(8, args.mib * MiB // size), span // size
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")

        def up() -> None:
            for i in range(count):
                j = i % slots
                dev.copy_(host[j * size:(j + 1) * size])

        def down() -> None:
            for i in range(count):
                j = i % slots
                back[j * size:(j + 1) * size].copy_(ref[j * size:(j + 1) * size])

        s, cpu = _timed(up)
        j = (count - 1) % slots
        out["exact"] &= bool(torch.equal(dev, ref[j * size:(j + 1) * size]))
        out["h2d"][size] = (count * size / s / GB, cpu / (count * size / GB))
        s, cpu = _timed(down)
        out["exact"] &= bool(torch.equal(back[j * size:(j + 1) * size], host[j * size:(j + 1) * size]))
        out["d2h"][size] = (count * size / s / GB, cpu / (count * size / GB))
    return out


def run_child(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", "--mib", str(args.mib), "--span", str(args.span)]
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"child failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for d in ("h2d", "d2h"):
        res[d] = {int(k): v for k, v in res[d].items()}
    return res


def crossover(rates: list[tuple[int, float, float]]) -> int | None:
    """The smallest size from which staging (b) beats native (a) at every larger size; None if never."""
    return next((n for i, (n, _a, _b) in enumerate(rates) if all(b > a for _n, a, b in rates[i:])), None)


def size_name(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="processes each way (medians)")
    ap.add_argument("--mib", type=int, default=512, help="MiB copied per size and direction")
    ap.add_argument("--span", type=int, default=256, help="MiB of host memory the copies walk over")
    ap.add_argument("--knob", action="append", default=None, metavar="NAME=VALUE",
                    help="start-up knobs of the preloaded runs (default: stage every pageable copy)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    from gpudash.preload.shm import preload_env

    knobs = ALWAYS_STAGE if args.knob is None else args.knob
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env = preload_env(base, "bench-sizes", {k: int(v) for k, v in (kv.split("=", 1) for kv in knobs)})
    print(f"preloaded runs: knobs {knobs}; {args.rounds} rounds, {args.mib} MiB per size and direction")
    runs: dict[str, list[dict[str, Any]]] = {"native": [], "preload": []}
    for _ in range(args.rounds):
        runs["native"].append(run_child(args, base))
        runs["preload"].append(run_child(args, env))
    exact = all(r["exact"] for rs in runs.values() for r in rs)
    for d in ("h2d", "d2h"):
        print(f"\n{d}: size     GB/s native  preload  ratio   CPU s/GB native  preload")
        rates = []
        for n in SIZES:
            gbs = {w: statistics.median(r[d][n][0] for r in rs) for w, rs in runs.items()}
            cpu = {w: statistics.median(r[d][n][1] for r in rs) for w, rs in runs.items()}
            rates.append((n, gbs["native"], gbs["preload"]))
            print(f"     {size_name(n):>8} {gbs['native']:>12.2f} {gbs['preload']:>8.2f} {gbs['preload'] / gbs['native']:>5.2f}x"
                  f" {cpu['native']:>15.3f} {cpu['preload']:>8.3f}")
        cross = crossover(rates)
        print(f"{d} crossover: {size_name(cross) if cross else 'none'} (staging faster from there on, medians)")
    print(f"\nmedians of {args.rounds} processes each way; byte-exact: {'yes' if exact else 'NO'}")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
