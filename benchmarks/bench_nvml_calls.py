"""What each NVML call that gpudash makes per tick costs on this box: wall and CPU time per call.

On GPUs whose driver answers through firmware (GSP), an NVML call may wait for its answer on the CPU,
so a call's CPU time is not the 2-10 us a memory query takes. This runs gpudash's own per-tick reads
(`Device.sample`, `Device.processes`, `Device.pcie_counters` of gpu/device.py) `--rounds` times on
every GPU, timing each NVML call they make through `nvml.call`, and prints per call: how often one
tick makes it, median wall and CPU microseconds, and the CPU it costs per second at a 1 s refresh
(the PCIe counters are read by a background poller, `--counter-reads` times a second while idle).

Run: python3 benchmarks/bench_nvml_calls.py [--rounds 200] [--counter-reads 8]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from typing import Any

from gpudash.gpu import nvml
from gpudash.gpu.device import devices


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200, help="ticks to time (default 200)")
    ap.add_argument("--counter-reads", type=float, default=2.0,
                    help="PCIe counter reads per second of the idle poller (default 2: one every 0.5 s)")
    args = ap.parse_args()
    reason = nvml.driver_available()
    if reason is not None:
        print(f"bench_nvml_calls: no NVIDIA GPUs ({reason})", file=sys.stderr)
        return 2
    devs = devices()
    wall: dict[str, list[float]] = collections.defaultdict(list)
    cpu: dict[str, list[float]] = collections.defaultdict(list)
    real_call = nvml.call

    def timed_call(fn: Any, *a: Any, **kw: Any) -> Any:
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return real_call(fn, *a, **kw)
        finally:
            name = getattr(fn, "__name__", repr(fn))
            wall[name].append((time.perf_counter() - w0) * 1e6)
            cpu[name].append((time.thread_time() - c0) * 1e6)

    nvml.call = timed_call
    units = {"sample": lambda d: d.sample(time.time(), None, None),
             "processes": lambda d: d.processes(time.time(), {}),
             "pcie_counters": lambda d: d.pcie_counters()}
    whole: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for d in devs:
            d.static  # read once, as gpudash does, and not timed per tick
        for _ in range(args.rounds):
            for d in devs:
                for unit, fn in units.items():
                    c0 = time.thread_time()
                    fn(d)
                    whole[unit].append((time.thread_time() - c0) * 1e6)
    finally:
        nvml.call = real_call
    ticks = args.rounds
    print(f"{len(devs)} GPU(s): {', '.join(d.static.name for d in devs)}; driver {nvml.driver_version()}; "
          f"{ticks} ticks")
    print(f"{'NVML call':<44} {'per tick':>8} {'wall us':>9} {'CPU us':>9} {'CPU ms/s at 1 Hz':>17}")
    total = 0.0
    for name in sorted(wall, key=lambda n: -statistics.median(cpu[n]) * len(cpu[n])):
        per_tick = len(wall[name]) / ticks
        rate = args.counter_reads if name == "nvmlDeviceGetFieldValues" else per_tick
        cost = statistics.median(cpu[name]) * rate / 1e3
        total += cost
        print(f"{name:<44} {per_tick:>8.1f} {statistics.median(wall[name]):>9.1f} "
              f"{statistics.median(cpu[name]):>9.1f} {cost:>17.3f}"
              + ("   (x counter reads/s, not per tick)" if rate != per_tick else ""))
    print(f"{'total':<44} {'':>8} {'':>9} {'':>9} {total:>17.3f}   = {total / 10:.2f}% of one core")
    print("\nCPU us per GPU and tick of each gpudash read, Python included (median):")
    for unit, xs in whole.items():
        print(f"  Device.{unit:<14} {statistics.median(xs):9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
