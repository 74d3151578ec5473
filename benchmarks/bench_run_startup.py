"""How soon `gpudash run -- CMD` starts CMD, beside starting CMD directly (issue 47's first goal: within 50 ms).

1. First instruction: the time from spawning the command to the first instruction of the program's main(),
   for a tiny C program compiled here that prints CLOCK_MONOTONIC (the clock every process on the machine
   shares) and exits. A C program, not `python3 -S -c`, because its main() runs microseconds after the loader
   is done: what is measured is the start alone, with nothing of the program's own start-up to subtract (a
   Python child's own start varies by several ms run to run, more than what is being measured at the end).
   Three ways: the program directly; directly with libgpudash_preload.so in LD_PRELOAD set by hand (what
   `gpudash run` gives it, so the difference to `gpudash run` is gpudash's own cost); through `gpudash run`,
   once with no config file and once with a config file whose [engine] table sets two knobs.
2. Ready time (with a llama-server and a tiny generated model; skipped, said so, where there is none):
   spawn to the first 200 from /health, for llama-server directly, with LD_PRELOAD by hand, through
   `gpudash run`, and started by gpudash's supervisor (`[[servers]] engine = "preload"`, Supervisor.start,
   which also probes the binary's --help and checks the port first). On a CPU llama-server the library
   carries no copy, so this measures the start path alone; the GPU figures come from the GPU machine.

Rounds are interleaved (one of each way per round); medians, minimum and maximum are printed side by side
with the ratio to the direct start. Run: python benchmarks/bench_run_startup.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.llama.locate import find_llama_server
from gpudash.preload.env import preload_env

CLOCK_C = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  printf("%lld\n", (long long)t.tv_sec * 1000000000LL + t.tv_nsec);
  return 0;
}
"""
TINY = DemoModelShape(layers=1, embedding=64, heads=2, heads_kv=2, feed_forward=128, context=512)
READY_TIMEOUT_S = 120


def _gpudash() -> list[str]:
    """The installed `gpudash` script beside this Python (what a user runs), else `python -m gpudash`."""
    script = Path(sys.executable).parent / "gpudash"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gpudash"]


def _first_instruction_ms(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic_ns()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60).stdout
    return (int(out.strip().splitlines()[-1]) - t0) / 1e6


def _wall_ms(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=True, timeout=60)
    return (time.perf_counter() - t0) * 1e3


def _table(title: str, results: dict[str, list[float]], base: str) -> None:
    print(f"\n{title}")
    print(f"{'way':<52}{'median ms':>10}{'min':>8}{'max':>8}{'x direct':>10}")
    ref = statistics.median(results[base])
    for way, xs in results.items():
        med = statistics.median(xs)
        print(f"{way:<52}{med:>10.1f}{min(xs):>8.1f}{max(xs):>8.1f}{med / ref:>10.2f}")


def first_instruction(rounds: int, work: Path) -> None:
    src, clock = work / "clock.c", work / "clock"
    src.write_text(CLOCK_C)
    subprocess.run(["cc", "-O2", "-o", str(clock), str(src)], check=True)
    home = {k: str(work / k) for k in ("none", "knobs")}
    (work / "knobs" / "gpudash").mkdir(parents=True)
    (work / "knobs" / "gpudash" / "config.toml").write_text('[engine]\nstaging_threads = 4\nh2d_chunk_bytes = "4MiB"\n')
    plain = {**os.environ}
    by_hand = preload_env(plain, "clock", {})
    ways: dict[str, Callable[[], float]] = {
        "direct": lambda: _first_instruction_ms([str(clock)], plain),
        "direct, LD_PRELOAD by hand": lambda: _first_instruction_ms([str(clock)], by_hand),
        "gpudash run (no config file)": lambda: _first_instruction_ms(
            [*_gpudash(), "run", "--", str(clock)], {**plain, "XDG_CONFIG_HOME": home["none"]}),
        "gpudash run ([engine] sets 2 knobs)": lambda: _first_instruction_ms(
            [*_gpudash(), "run", "--", str(clock)], {**plain, "XDG_CONFIG_HOME": home["knobs"]}),
        "whole of gpudash --version (context)": lambda: _wall_ms([*_gpudash(), "--version"], plain),
    }
    results: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(rounds):
        for way, measure in ways.items():
            results[way].append(measure())
    _table(f"spawn -> the program's first instruction, {rounds} interleaved rounds", results, "direct")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until_ready(port: int, proc: subprocess.Popen | None, t0: float) -> float:
    """ms from t0 to the first 200 from /health."""
    url = f"http://127.0.0.1:{port}/health"
    deadline = t0 + READY_TIMEOUT_S
    with httpx.Client(timeout=1.0) as client:
        while time.perf_counter() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode} before it was ready")
            try:
                if client.get(url).status_code == 200:
                    return (time.perf_counter() - t0) * 1e3
            except httpx.HTTPError:
                pass
            time.sleep(0.002)
    raise RuntimeError(f"llama-server not ready within {READY_TIMEOUT_S} s")


def _spawned_ready_ms(argv: list[str], env: dict[str, str], port: int) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return _until_ready(port, proc, t0)
    finally:
        proc.send_signal(signal.SIGTERM)  # `gpudash run` forwards it to llama-server
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _supervised_ready_ms(binary: str, model: Path, port: int, logs: Path) -> float:
    from gpudash.config import ServerSpec
    from gpudash.launcher.supervisor import Supervisor
    from gpudash.telemetry.inbox import Inbox

    spec = ServerSpec(name="bench", model=str(model), binary=binary, engine="preload", port=port, n_gpu_layers=0)
    sup = Supervisor([spec], Inbox(), logs, preload_knobs={})
    try:
        t0 = time.perf_counter()
        sup.start("bench")  # returns once /health answers 200
        return (time.perf_counter() - t0) * 1e3
    finally:
        sup.stop_all()


def ready_time(rounds: int, work: Path) -> None:
    binary = find_llama_server()
    if binary is None:
        print("\nready time: skipped, no llama-server here (`gpudash llama build` makes one)")
        return
    model = write_demo_model(work / "tiny.gguf", TINY)
    plain = {**os.environ}
    by_hand = preload_env(plain, "llama", {})
    args = ["-m", str(model), "--host", "127.0.0.1", "-ngl", "0", "-c", "512", "--port"]
    cfg = {**plain, "XDG_CONFIG_HOME": str(work / "none")}
    ways: dict[str, Callable[[int], float]] = {
        "llama-server directly": lambda p: _spawned_ready_ms([binary, *args, str(p)], plain, p),
        "llama-server, LD_PRELOAD by hand": lambda p: _spawned_ready_ms([binary, *args, str(p)], by_hand, p),
        "gpudash run -- llama-server": lambda p: _spawned_ready_ms([*_gpudash(), "run", "--", binary, *args, str(p)],
                                                                   cfg, p),
        'supervisor, engine = "preload" (Supervisor.start)': lambda p: _supervised_ready_ms(binary, model, p,
                                                                                           work / "logs"),
    }
    results: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(rounds):
        for way, measure in ways.items():
            results[way].append(measure(_free_port()))
    _table(f"spawn -> first 200 from /health ({binary}, CPU, tiny model), {rounds} interleaved rounds", results,
           "llama-server directly")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the first-instruction table")
    ap.add_argument("--ready-rounds", type=int, default=5, help="interleaved rounds of the ready-time table")
    args = ap.parse_args()
    if shutil.which("cc") is None:
        sys.exit("bench_run_startup: needs a C compiler (cc) for its clock program")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; gpudash: {' '.join(_gpudash())}")
    with tempfile.TemporaryDirectory(prefix="gpudash-bench-run-") as tmp:
        first_instruction(args.rounds, Path(tmp))
        if args.ready_rounds > 0:
            ready_time(args.ready_rounds, Path(tmp))


if __name__ == "__main__":
    main()
