"""From `pip install` to a useful screen: issue 33's figures, this tree beside a baseline tree (a git ref,
by default the tree before issue 33), on this machine.

1. `gpudash --help` against `gpudash --version` (median of --runs each, in fresh interpreters of a venv
   that holds gpudash's dependencies and runs each tree's sources);
2. the wheel (packaging/build_wheel.py) into a fresh venv, with no compiler on PATH, from a warm pip
   cache (median of 3) and an empty one, beside `pip install .` of the source (which compiles the engine);
3. a fresh clone to the first frame of `gpudash launch`, following the clone's own README: its "Run it"
   command, run word for word with an empty pip cache and empty user folders, its `gpudash launch` in a
   tmux terminal until the header is drawn. The baseline's README compiles llama.cpp in the foreground
   (13-25 minutes on 2 cores): --with-baseline-clone runs it too.
4. `gpudash status --json --sim h200` against `gpudash --version` (issue 46: at most 2x), interleaved, this
   tree beside --status-baseline (default: main); also with `--window 0.05`, its shortest, because the
   default window is a 0.5 s wait between the two reads that PCIe rates are measured over, not start-up.
5. What `pip install` of the wheel brings into a fresh venv besides gpudash itself (issue 46): its
   dependencies (pyproject's list, what the wheel requires) installed into a fresh venv, each distribution's
   installed size (the files its RECORD lists) and which of gpudash's dependencies pulls it in.

Run: .venv/bin/python benchmarks/bench_first_run.py [--runs 7] [--baseline-ref REF] [--wheel PATH]
     [--with-baseline-clone] [--status-baseline REF] [--skip help,wheel,clone,status,size]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE_REF = "fbe9fa0"  # main before issue 33 (the README's Run it built llama.cpp in the foreground)
GOALS = {"status": "status <= 2x version", "help": "help <= 2x version", "wheel": "<= 30 s, no compiler", "clone": "<= 120 s"}


def timed(argv: list[str], **kw) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t0


def tree_of(ref: str, dest: Path) -> Path:
    """The files of `ref` (git archive), unpacked into `dest`."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def tomllib_deps() -> list[str]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def re_name(requirement: str) -> str:
    import re

    return re.split(r"[ ;<>=!~\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def deps_only_python(tmp: Path) -> Path:
    """A venv with gpudash's dependencies but not gpudash (an editable install's import hook would import
    this checkout's gpudash whatever PYTHONPATH says), and gpudash's metadata alone, which --version reads."""
    target = tmp / "deps-venv"
    venv.create(target, with_pip=True)
    deps = tomllib_deps()
    subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", *deps], check=True,
                   capture_output=True)
    site = subprocess.run([str(target / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    meta = Path(site) / "gpudash-0.1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: gpudash\nVersion: 0.1.0\n")
    return target / "bin" / "python"


def help_vs_version(python: Path, tree: Path, runs: int) -> tuple[float, float]:
    """Median seconds of `gpudash --version` and `--help` run from `tree`'s sources."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [str(python), "-m", "gpudash"]
    version = statistics.median(timed([*cmd, "--version"], env=env, cwd=tree) for _ in range(runs))
    helped = statistics.median(timed([*cmd, "--help"], env=env, cwd=tree) for _ in range(runs))
    return version, helped


def status_vs_version(python: Path, tree: Path, runs: int) -> dict[str, float]:
    """Median seconds of `gpudash --version` and `status --json --sim h200` (default window and --window 0.05),
    interleaved, from `tree`'s sources; the sim rig's engine is the library this checkout built."""
    from gpudash.engine import _native

    lib = next(p for p in _native._candidates() if p.is_file())
    env = {**os.environ, "PYTHONPATH": str(tree), "GPUDASH_ENGINE_LIB": str(lib)}
    cmd = [str(python), "-m", "gpudash"]
    ways = {"version": ["--version"], "status": ["status", "--json", "--sim", "h200"],
            "status, --window 0.05": ["status", "--json", "--sim", "h200", "--window", "0.05"]}
    times: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(runs):
        for way, args in ways.items():
            times[way].append(timed([*cmd, *args], env=env, cwd=tree))
    return {w: statistics.median(xs) for w, xs in times.items()}


FOOTPRINT = r"""
import json, re
from importlib import metadata
from pathlib import Path

def name(s):
    return re.split(r"[ ;<>=!~\[(]", s.strip(), maxsplit=1)[0].lower().replace("_", "-")

dists = {name(d.metadata["Name"]): d for d in metadata.distributions()}
size = {n: sum((Path(d.locate_file(f)).stat().st_size for f in (d.files or []) if Path(d.locate_file(f)).is_file()))
        for n, d in dists.items()}
needs = {n: [name(r) for r in (d.requires or []) if "extra ==" not in r] for n, d in dists.items()}
print(json.dumps({"size": size, "needs": needs}))
"""


def footprint(python: Path, roots: list[str]) -> list[tuple[str, float, str]]:
    """(distribution, installed MB, the roots that pull it in) for every distribution in `python`'s venv."""
    got = json.loads(subprocess.run([str(python), "-c", FOOTPRINT], check=True, capture_output=True, text=True).stdout)
    size, needs = got["size"], got["needs"]
    by: dict[str, set[str]] = {n: set() for n in size}
    for root in roots:
        seen, todo = set(), [root]
        while todo:
            n = todo.pop()
            if n in seen or n not in size:
                continue
            seen.add(n)
            by[n].add(root)
            todo += needs.get(n, [])
    roots_of = {n: ", ".join(sorted(r)) if r else "(the venv's own, or a dependency's extra)" for n, r in by.items()}
    rows = [(n, size[n] / 1e6, roots_of[n]) for n in size if n != "gpudash"]
    return sorted(rows, key=lambda r: -r[1])


def fresh_env(tmp: Path, path: str | None = None, cache: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "GPUDASH_ENGINE_LIB")}
    env.update(HOME=str(tmp / "home"), XDG_CONFIG_HOME=str(tmp / "config"), XDG_DATA_HOME=str(tmp / "data"),
               XDG_CACHE_HOME=str(tmp / "cache"), XDG_STATE_HOME=str(tmp / "state"))
    env["PIP_CACHE_DIR"] = str(cache) if cache is not None else env.get("PIP_CACHE_DIR",
                                                                        str(Path.home() / ".cache" / "pip"))
    if path is not None:
        env["PATH"] = path
    return env


def wheel_install(wheel: Path, tmp: Path, cache: Path | None) -> float:
    """Seconds to make a venv and install the wheel into it, with only the venv's bin/ on PATH."""
    target = tmp / f"venv-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    venv.create(target, with_pip=True)
    subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--only-binary=:all:",
                    str(wheel)], check=True, env=fresh_env(tmp, str(target / "bin"), cache), capture_output=True)
    return time.perf_counter() - t0


def source_install(tree: Path, tmp: Path) -> float:
    target = tmp / f"venv-src-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    venv.create(target, with_pip=True)
    subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", str(tree)], check=True,
                   env=fresh_env(tmp), capture_output=True, cwd=tmp)
    return time.perf_counter() - t0


def run_it_command(readme: str) -> str:
    """The README's "Run it" command: its first sh block."""
    return re.findall(r"```sh\n(.*?)\n```", readme, re.S)[0].strip()


def first_frame(clone: Path, tmp: Path) -> tuple[float, float]:
    """Follow the clone's README "Run it": (seconds until gpudash launch is started, then until its first
    frame shows the header). Install steps run as written; the launch runs in a tmux terminal."""
    command = run_it_command((clone / "README.md").read_text())
    steps = [s.strip() for s in command.split("&&")]
    launch = steps.pop()
    assert launch.endswith("gpudash launch"), command
    env = fresh_env(tmp, cache=tmp / "empty-pip-cache")
    t0 = time.perf_counter()
    for step in steps:
        subprocess.run(shlex.split(step), check=True, cwd=clone, env=env, capture_output=True)
    installed = time.perf_counter() - t0
    socket = f"bench-first-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    shell_env = " ".join(shlex.quote(f"{k}={env[k]}") for k in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                                                               "XDG_CACHE_HOME", "XDG_STATE_HOME", "PATH"))
    t1 = time.perf_counter()
    subprocess.run([*tmux, "new-session", "-d", "-s", "g", "-x", "160", "-y", "48", "-c", str(clone),
                    f"exec env -u COLUMNS -u LINES {shell_env} {launch}"], check=True)
    try:
        while True:
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", "g"], capture_output=True, text=True).stdout
            if " gpudash " in screen and ("SIM" in screen or "real GPUs" in screen):
                return installed, time.perf_counter() - t1
            if time.perf_counter() - t1 > 600:
                raise RuntimeError(f"no first frame after 600 s:\n{screen}")
            time.sleep(0.05)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)  # SIGHUP: gpudash quits, stops its build


def row(name: str, this: float, base: float | None, unit: str = "s", goal: str = "") -> str:
    b = f"{base:>12.2f}" if base is not None else f"{'not run':>12}"
    ratio = f"{this / base:>8.2f}" if base else f"{'':>8}"
    return f"{name:<44} {this:>10.2f} {b} {ratio}   {goal}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--baseline-ref", default=BASELINE_REF)
    ap.add_argument("--wheel", type=Path, help="a wheel built by packaging/build_wheel.py (default: build one)")
    ap.add_argument("--with-baseline-clone", action="store_true", help="also follow the baseline's README")
    ap.add_argument("--status-baseline", default="main", help="the tree `status` is compared with")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: help, wheel, clone, status")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; baseline {args.baseline_ref}")
    print(f"{'figure':<44} {'this':>10} {'baseline':>12} {'ratio':>8}   goal")
    with tempfile.TemporaryDirectory(prefix="bench-first-") as d:
        tmp = Path(d)
        base_tree = tree_of(args.baseline_ref, tmp / "baseline")
        this_tree = tree_of("HEAD", tmp / "this")
        python = deps_only_python(tmp) if {"help", "status", "size"} - skip else None
        if "status" not in skip and python is not None:
            this = status_vs_version(python, this_tree, args.runs)
            base = status_vs_version(python, tree_of(args.status_baseline, tmp / "status-baseline"), args.runs)
            for way in this:
                print(row(f"gpudash {way} (s, median)", this[way], base[way]))
            print(row("status / --version", this["status"] / this["version"], base["status"] / base["version"],
                      goal=GOALS["status"]))
            print(row("status --window 0.05 / --version", this["status, --window 0.05"] / this["version"],
                      base["status, --window 0.05"] / base["version"]))
        if "size" not in skip:
            size_python = python if python is not None else deps_only_python(tmp)
            deps = tomllib_deps()
            rows = footprint(size_python, [re_name(d) for d in deps])
            print(f"\n{len(rows)} distributions, {sum(r[1] for r in rows):.1f} MB installed (gpudash's dependencies "
                  "into a fresh venv; gpudash itself not counted):")
            for n, mb, by in rows:
                print(f"  {n:<28}{mb:>8.1f} MB   {by}")
        if "help" not in skip and python is not None:
            v, h = help_vs_version(python, this_tree, args.runs)
            bv, bh = help_vs_version(python, base_tree, args.runs)
            print(row("gpudash --version (s, median)", v, bv))
            print(row("gpudash --help (s, median)", h, bh))
            print(row("--help / --version", h / v, bh / bv, goal=GOALS["help"]))
        if "wheel" not in skip:
            wheel = args.wheel
            if wheel is None:
                subprocess.run([sys.executable, str(REPO / "packaging" / "build_wheel.py"), "--out", str(tmp / "dist"),
                                "--tools", str(tmp / "tools"), "--build-root", str(tmp / "build")], check=True,
                               capture_output=True)
                (wheel,) = (tmp / "dist").glob("*.whl")
            warm = statistics.median(wheel_install(wheel, tmp, None) for _ in range(3))
            cold = wheel_install(wheel, tmp, tmp / f"empty-cache-{uuid.uuid4().hex[:6]}")
            src = source_install(base_tree, tmp)
            print(row("wheel into a fresh venv, warm pip cache (s)", warm, src, goal=GOALS["wheel"]))
            print(row("wheel into a fresh venv, empty pip cache (s)", cold, src))
            print(f"{'':<44} (baseline: pip install of the baseline's source, compiling the engine)")
        if "clone" not in skip:
            clone = tmp / "clone"
            subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
            installed, frame = first_frame(clone, tmp / "clone-home")
            base = None
            if args.with_baseline_clone:
                bclone = tmp / "bclone"
                subprocess.run(["git", "clone", "--quiet", str(REPO), str(bclone)], check=True)
                subprocess.run(["git", "-C", str(bclone), "checkout", "--quiet", args.baseline_ref], check=True)
                b_installed, b_frame = first_frame(bclone, tmp / "bclone-home")
                base = b_installed + b_frame
            print(row("fresh clone -> first frame of launch (s)", installed + frame, base, goal=GOALS["clone"]))
            print(f"{'':<44} (install {installed:.1f} s, then the first frame {frame:.1f} s after launch)")


if __name__ == "__main__":
    main()
