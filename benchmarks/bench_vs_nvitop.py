"""CPU cost of watching: `gpudash launch` beside `nvitop`, both on the same real GPUs, in one run.

Each runs in its own terminal of the same size (a private tmux server) at a 1 s refresh; after a warm-up,
the CPU time of each app's own process is read over the same window (the llama-server that gpudash
supervises is a child process and is not counted; its /metrics scrape and supervision are, since they
run in gpudash). The table gives % of one core and gpudash / nvitop (the goal: at most 1.5). Needs NVIDIA
GPUs and nvitop (`pip install nvitop`): on a machine without a driver it says so and exits 2, since a
simulated rig would measure something else.

Whether gpudash ran the embedded demo is said, never guessed: --demo runs it (a llama-server that gpudash
supervises, probe off), the default runs none (`demo = false`: pure watching, or the servers found on the
GPUs, attached). The run also prints what gpudash itself holds: its VRAM from NVML's process list (no
CUDA context while it only watches) and the mean of its header's own-CPU figure over the window, read off
the screen each second, beside the CPU its process really used.

--profile DIR says where gpudash's time goes: its CPU per thread over the same window (from
/proc/PID/task, Python threads named by `py-spy dump`), and, with py-spy installed, a sampled profile of
the window (py-spy record --nonblocking, collapsed stacks in DIR/gpudash.pyspy.txt) summarised by the
frames that hold most samples.

Run: .venv/bin/python benchmarks/bench_vs_nvitop.py [--seconds 60] [--size 160x48] [--demo] [--profile DIR]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
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


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of `pid`: (its OS name, user + system clock ticks so far)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            comm = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(task.name)] = (comm, int(fields[11]) + int(fields[12]))
    return out


def python_thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name, from `py-spy dump` (empty without py-spy)."""
    if shutil.which("py-spy") is None:
        return {}
    dump = subprocess.run(["py-spy", "dump", "-p", str(pid)], capture_output=True, text=True).stdout
    names = {}
    for line in dump.splitlines():
        if line.startswith("Thread ") and '"' in line:
            head, name = line.split('"', 1)
            tid = head.split()[1]
            if tid.isdigit():
                names[int(tid)] = name.rstrip('"')
    return names


def per_thread_cpu(pid: int, before: dict[int, tuple[str, int]], wall: float) -> list[tuple[float, int, str]]:
    """(% of one core, tid, name) per thread of `pid` since `before`, busiest first."""
    after, names, hz = thread_ticks(pid), python_thread_names(pid), os.sysconf("SC_CLK_TCK")
    used = [((after[t][1] - before.get(t, ("", 0))[1]) / hz / wall * 100, t, names.get(t, after[t][0])) for t in after]
    return sorted(used, reverse=True)


def hottest_frames(collapsed: Path, tid: int, top: int = 10) -> list[str]:
    """Where one thread's py-spy samples were: each sample counted at its deepest gpudash frame (else
    its leaf) and the leaf beneath it, busiest first, as shares of the thread's samples."""
    where: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        thread, *frames = stack.split(";")
        if f"({tid})" not in thread or not frames:
            continue
        total += int(count)
        ours = [f for f in frames if "gpudash/" in f]
        where[f"{ours[-1] if ours else frames[-1]}  <  {frames[-1]}"] += int(count)
    return [f"  {n / total * 100:6.1f}%  {frame}" for frame, n in where.most_common(top)] if total else []


def vram_of(pid: int) -> int:
    """Bytes of GPU memory `pid` holds on all GPUs, from NVML's process lists."""
    from gpudash.gpu.device import devices

    return sum(p.used_bytes or 0 for d in devices() for p in d.processes(0.0, {}) if p.pid == pid)


def header_cpu(screen: str) -> float | None:
    """The own-CPU figure gpudash's screen shows ("gpudash CPU 1.3%"), or None."""
    m = re.search(r"gpudash CPU ([0-9.]+)%", screen)
    return float(m.group(1)) if m else None


def demo_servers(proc: psutil.Process) -> list[psutil.Process]:
    """The llama-servers gpudash runs (its children)."""
    return [c for c in proc.children(recursive=True) if "llama-server" in (c.name() or "")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window (default 60)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring (default 10)")
    ap.add_argument("--size", default="160x48", help="terminal size for both (default 160x48)")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="also profile gpudash over the window into DIR")
    ap.add_argument("--demo", action="store_true", help="let gpudash run its demo llama-server (default: none)")
    args = ap.parse_args()
    size = tuple(int(x) for x in args.size.split("x"))
    if shutil.which("tmux") is None:
        sys.exit("bench_vs_nvitop: tmux is needed; install it")
    if importlib.util.find_spec("nvitop") is None:
        sys.exit("bench_vs_nvitop: nvitop is not importable here; pip install nvitop into this environment")
    from gpudash.gpu.nvml import driver_available

    reason = driver_available()
    if reason is not None:
        print(f"bench_vs_nvitop: no NVIDIA GPUs ({reason}); this compares real GPU monitoring only", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.toml"
        cfg.write_text(f"demo = {'true' if args.demo else 'false'}\n\n[sampling]\ninterval_s = 1.0\n\n"
                       "[probe]\nenabled = false\n")
        try:
            ours = start("gpudash", [*GPUDASH, "--config", str(cfg), "launch", "--no-sim", "--no-record"], size)
            theirs = start("nvitop", [*NVITOP, "--interval", "1"], size)
            time.sleep(args.warmup)
            spy = None
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                ticks0 = thread_ticks(ours.pid)
                if shutil.which("py-spy"):
                    spy = subprocess.Popen(["py-spy", "record", "--nonblocking", "--threads", "-r", "50", "-f", "raw",
                                            "-d", str(int(args.seconds)), "-p", str(ours.pid),
                                            "-o", str(args.profile / "gpudash.pyspy.txt")],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            c0 = (cpu_s(ours), cpu_s(theirs))
            t0 = time.perf_counter()
            shown: list[float] = []  # the header's own-CPU figure, read once a second
            while (left := args.seconds - (time.perf_counter() - t0)) > 0:
                time.sleep(min(1.0, left))
                if (figure := header_cpu(tmux("capture-pane", "-p", "-t", "gpudash"))) is not None:
                    shown.append(figure)
            c1 = (cpu_s(ours), cpu_s(theirs))
            wall = time.perf_counter() - t0
            demo = demo_servers(ours)
            vram = (vram_of(ours.pid), vram_of(theirs.pid))
            threads = per_thread_cpu(ours.pid, ticks0, wall) if args.profile else []
            if spy is not None:
                spy.wait(timeout=30)
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
    print(f"demo: {'ran, llama-server pid ' + ', '.join(str(p.pid) for p in demo) if demo else 'none ran'}"
          f"{' (asked for with --demo)' if args.demo else ' (demo = false)'}")
    print(f"VRAM held: gpudash {vram[0] / 2**20:.0f} MiB, nvitop {vram[1] / 2**20:.0f} MiB (NVML, after the window)")
    if shown:
        print(f"gpudash's header own-CPU figure: mean {sum(shown) / len(shown):.2f}% over {len(shown)} reads "
              f"(its process used {g:.2f}%)")
    if threads:
        print(f"\ngpudash per thread over the window:\n{'thread (Python name, else OS name)':<40} {'tid':>8} "
              f"{'CPU % of one core':>18}")
        for pct, tid, name in threads[:15]:
            print(f"{name:<40} {tid:>8} {pct:>18.2f}")
        stacks = args.profile / "gpudash.pyspy.txt"
        for pct, tid, name in threads[:4] if stacks.exists() else ():
            print(f"\npy-spy samples of {name} ({pct:.2f}% of a core): frames under most of them, inclusive")
            print("\n".join(hottest_frames(stacks, tid)) or "  (no samples: a native thread)")


if __name__ == "__main__":
    main()
