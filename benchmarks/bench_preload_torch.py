"""PyTorch's own copies with and without the transfer engine inside the process (libgpudash_preload.so).

The script runs itself twice as a subprocess, once plainly and once with the preload environment that
`gpudash run` gives, and prints one side-by-side table (GB/s, or us per copy for the small copies) with
the ratio, then the preloaded run's stats block: copies the engine took and passed through.

Cases, measured after a warm-up: a pageable 4 GiB tensor's first `.cuda()` (with PyTorch's cudaMalloc of
the block) and the median of the next three (the block cached); `.cpu()` into fresh pageable memory
(median of four); a pinned 1 GiB tensor both ways (`copy_`); 10k copies of 4 KiB pageable tensors, again
in `--small-rounds` fresh pairs of processes (the median, and the median paired difference).
Every result is checked byte for byte. Needs PyTorch with CUDA and an NVIDIA GPU.

Run: python benchmarks/bench_preload_torch.py [--gib 4] [--pinned-gib 1] [--small 10000] [--small-rounds 14]
     [--knob k=v ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import time
from typing import Any

GiB = 2**30
SMALL = "{n} x 4 KiB .copy_() us/copy"


def _pattern(n: int) -> Any:
    """n bytes of a pattern whose every 8-byte word is its own index (a misplaced chunk shows)."""
    import numpy as np
    import torch

    return torch.from_numpy(np.arange(n // 8, dtype=np.int64)).view(torch.uint8)


def _exact_on_gpu(t: Any) -> bool:
    import torch

    words = t.view(torch.int64)
    return bool(torch.equal(words, torch.arange(words.numel(), device=t.device, dtype=torch.int64)))


def _exact_on_host(t: Any) -> bool:
    import numpy as np

    words = t.numpy().view(np.int64)
    return bool(np.array_equal(words, np.arange(words.size, dtype=np.int64)))


def _timed(fn: Any) -> tuple[float, Any]:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def _small_copies(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """The 4 KiB case: pageable tensors copied to one device tensor, us per copy."""
    import torch

    small = [_pattern(4096) for _ in range(16)]
    target = torch.empty(4096, dtype=torch.uint8, device="cuda")

    def many() -> None:
        for i in range(args.small):
            target.copy_(small[i % len(small)])

    s, _ = _timed(many)
    out["figures"][SMALL.format(n=args.small)] = s / args.small * 1e6
    out["exact"]["4 KiB copies"] = _exact_on_gpu(target)


def _wait_for_engine(timeout_s: float = 10.0) -> None:
    """Until the preload's stats block says its engine (started by the warm-up copy) runs."""
    from gpudash.preload.shm import BlockUnavailable, StatsView

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with StatsView(os.getpid()) as view:
                if view.read().engine_start_s is not None:
                    return
        except BlockUnavailable:
            pass
        time.sleep(0.01)
    raise SystemExit("the preloaded engine did not start within 10 s")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run of every case in this process (or only the small copies); figures and checks as a dict."""
    import torch

    torch.cuda.init()
    warm = torch.ones(1 << 20, dtype=torch.uint8)
    assert torch.equal(warm.cuda().cpu(), warm)
    out: dict[str, Any] = {"figures": {}, "exact": {}}
    if args.only_small:
        if os.environ.get("LD_PRELOAD"):
            _wait_for_engine()  # a passed copy's cost, not that of the engine's one-time start beside it
        _small_copies(args, out)
        return out
    n = args.gib * GiB
    src = _pattern(n)
    # The first .cuda() also pays PyTorch's cudaMalloc of the block; later ones reuse the cached block, so
    # their median is the copy a loader repeats (a model reloaded, a sleeping server woken).
    s, dev = _timed(lambda: src.cuda())
    out["figures"][f"pageable {args.gib} GiB .cuda() GB/s, first"] = n / s / 1e9
    out["exact"]["pageable .cuda()"] = _exact_on_gpu(dev)
    again = []
    for _ in range(args.repeat):
        del dev
        s, dev = _timed(lambda: src.cuda())
        again.append(n / s / 1e9)
        out["exact"]["pageable .cuda()"] &= _exact_on_gpu(dev)
    out["figures"][f"pageable {args.gib} GiB .cuda() GB/s, median of {args.repeat} more"] = statistics.median(again)
    del src
    fresh = []
    for _ in range(1 + args.repeat):  # each into fresh pageable memory
        s, back = _timed(lambda: dev.cpu())
        fresh.append(n / s / 1e9)
        out["exact"]["pageable .cpu()"] = out["exact"].get("pageable .cpu()", True) and _exact_on_host(back)
        del back
    out["figures"][f"pageable {args.gib} GiB .cpu() GB/s, median of {1 + args.repeat}"] = statistics.median(fresh)
    del dev

    m = args.pinned_gib * GiB
    pinned = _pattern(m).pin_memory()
    gpu = torch.empty(m, dtype=torch.uint8, device="cuda")
    s, _ = _timed(lambda: gpu.copy_(pinned, non_blocking=True))
    out["figures"][f"pinned {args.pinned_gib} GiB H2D GB/s"] = m / s / 1e9
    out["exact"]["pinned H2D"] = _exact_on_gpu(gpu)
    dst = torch.empty(m, dtype=torch.uint8).pin_memory()
    s, _ = _timed(lambda: dst.copy_(gpu, non_blocking=True))
    out["figures"][f"pinned {args.pinned_gib} GiB D2H GB/s"] = m / s / 1e9
    out["exact"]["pinned D2H"] = _exact_on_host(dst)
    del pinned, gpu, dst

    _small_copies(args, out)
    if os.environ.get("LD_PRELOAD"):
        from gpudash.preload.shm import BlockUnavailable, StatsView

        try:
            with StatsView(os.getpid()) as view:
                st = view.read_after(time.time())
            out["preload"] = [f"state {st.state}, knobs {st.knobs}", *st.summary_lines()]
        except BlockUnavailable as err:
            out["preload"] = [f"no stats block: {err}"]
    return out


def _run_child(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    r = subprocess.run([sys.executable, __file__, "--child", *argv], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the benchmark run failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=int, default=4, help="size of the pageable tensor (GiB)")
    ap.add_argument("--pinned-gib", type=int, default=1, help="size of the pinned tensor (GiB)")
    ap.add_argument("--small", type=int, default=10_000, help="number of 4 KiB copies")
    ap.add_argument("--repeat", type=int, default=3, help="timed .cuda()/.cpu() after the first (median)")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="start-up knob of the preloaded engine (integers; repeatable)")
    ap.add_argument("--small-rounds", type=int, default=14,
                    help="more runs of only the 4 KiB case, without and with the preload in turn (median)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only-small", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    from gpudash.preload.shm import preload_env

    knobs = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.knob)}
    passed = ["--gib", str(args.gib), "--pinned-gib", str(args.pinned_gib), "--small", str(args.small),
              "--repeat", str(args.repeat)]
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env = preload_env(base, "bench-torch", knobs)
    native = _run_child(passed, base)
    pre = _run_child(passed, env)
    # One process's 10k small copies vary by +-20% from process to process (clocks, placement): the
    # small case is run again in fresh processes, without and with the preload in turn (the preloaded
    # one once its engine runs), and the table gives the medians; the per-round difference is the
    # preload's cost per passed copy.
    small = SMALL.format(n=args.small)
    rounds = [(native["figures"][small], pre["figures"][small])]
    for _ in range(args.small_rounds):
        rounds.append((_run_child([*passed, "--only-small"], base)["figures"][small],
                       _run_child([*passed, "--only-small"], env)["figures"][small]))
    name = f"{small}, median of {len(rounds)} runs"
    for run, i in ((native, 0), (pre, 1)):
        run["figures"][name] = statistics.median(r[i] for r in rounds)
        del run["figures"][small]
    print(f"{'case':<46}{'without':>12}{'with preload':>14}{'ratio':>8}")
    for name, a in native["figures"].items():
        b = pre["figures"][name]
        ratio = a / b if name.endswith("us/copy") else b / a  # > 1: the preload is better
        print(f"{name:<46}{a:>12.3f}{b:>14.3f}{ratio:>7.2f}x")
    checks = {k: (native["exact"][k], pre["exact"][k]) for k in native["exact"]}
    print(f"4 KiB copies, preload minus native per copy, median of {len(rounds)} paired runs: "
          f"{statistics.median(b - a for a, b in rounds):+.2f} us (runs: "
          + ", ".join(f"{b - a:+.2f}" for a, b in rounds) + ")")
    print("byte-exact: " + ", ".join(f"{k} {'ok' if a and b else 'MISMATCH'}" for k, (a, b) in checks.items()))
    print("preload stats block of the preloaded run:")
    for line in pre.get("preload", ["(none)"]):
        print(f"  {line}")
    return 0 if all(a and b for a, b in checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
