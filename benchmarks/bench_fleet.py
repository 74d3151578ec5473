"""Fleet benchmark: `gpudash fleet` over a mixed fleet of 100 boxes in one real Prometheus, and the Fleet
view's refresh cost.

The boxes are as operators run them, each on its own loopback address (a box is a host): half run gpudash
(its PrometheusSink, in this process, serving a tick of a simulated rig plus two generated inference
servers with probe TTFTs); the other half run no gpudash: a dcgm-exporter stand-in built from its own
default counters file (tests/fleet/dcgm_standin.py) for a rig's GPUs and a vLLM serving the /metrics of
tests/launcher/samples/vllm-0.33.0-metrics-dp2-a.txt. Debian's Prometheus (`apt-get install prometheus`)
scrapes all 150 targets every 2 s with the shipped rules loaded. Then:
  * `gpudash fleet --prometheus URL --json`, the whole command (Python start included), median of 5, its
    CPU time, and `gpudash fleet --help` beside it: the start-up (interpreter, imports, config) alone;
  * read_fleet() alone (the query and the assembly), median of 10;
  * the Fleet view's refresh at 1 s: a separate process that reads the fleet once a second for
    --cpu-seconds and builds its rows (what the view's worker does), its CPU share of one core;
  * the real `gpudash launch --sim h200` in tmux (bench_tui's helpers): its CPU on the Fleet tab and on
    the Events tab, each for --cpu-seconds, while every gpudash box's utilisation moves each second (so
    rows change at every scrape); the difference is the tab's own cost (reads, rows, table).
Printed beside the issue's targets (ratio = measured / target, <= 1 is met).

Run: .venv/bin/python benchmarks/bench_fleet.py [--boxes 100] [--cpu-seconds 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fleet"))  # the tests' way to start a private Prometheus
sys.path.insert(0, str(REPO / "tests" / "cli"))
import dcgm_standin  # noqa: E402
from fleet_helpers import start_prometheus, stop, wait_for  # noqa: E402

import bench_tui as tui  # noqa: E402  (its private tmux server and screen helpers)

from gpudash.config import Config, PrometheusConfig  # noqa: E402
from gpudash.fleet.boxes import read_fleet  # noqa: E402
from gpudash.fleet.client import PrometheusClient  # noqa: E402
from gpudash.labels import sim_label  # noqa: E402
from gpudash.records import RequestSample, ServerSample, Snapshot  # noqa: E402
from gpudash.telemetry.factory import build_sources  # noqa: E402
from gpudash.telemetry.prometheus import PrometheusSink  # noqa: E402
from gpudash.telemetry.sampler import Sampler  # noqa: E402

PROFILES = ("8xh20", "rtx5080+rtx3090", "h200")
VLLM_METRICS = (REPO / "tests" / "launcher" / "samples" / "vllm-0.33.0-metrics-dp2-a.txt").read_text()
REFRESH_LOOP = """
import sys, time
from gpudash.fleet.cells import box_cells
from gpudash.fleet.boxes import read_fleet
from gpudash.fleet.client import PrometheusClient
client = PrometheusClient(sys.argv[1])
read_fleet(client, detail=False)  # warm: imports and the connection are not the refresh's cost
c0, w0 = time.process_time(), time.monotonic()
while time.monotonic() < w0 + float(sys.argv[2]):
    t0 = time.monotonic()
    fleet = read_fleet(client, detail=False)
    rows = [box_cells(b) for b in fleet.boxes]
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
print((time.process_time() - c0) / (time.monotonic() - w0))
"""


def rig_snapshots() -> dict[str, Snapshot]:
    """One real tick of each simulated rig (two polls, so rates are measured)."""
    out = {}
    for profile in PROFILES:
        label = sim_label(profile)
        sampler = Sampler(build_sources(label, Config()), 0.2, label)
        try:
            sampler.poll_once()
            time.sleep(0.2)
            out[profile] = sampler.poll_once()
        finally:
            sampler.stop()
    return out


def box_snapshot(base: Snapshot, box: int, tick: int) -> Snapshot:
    servers = tuple(ServerSample(base.ts, f"srv{k}", "vllm" if k else "llama.cpp", "ready", tokens_per_s=40.0 + box,
                                 kv_cache_usage=0.3, prefix_cache_queries=1000.0 * tick, prefix_cache_hits=600.0 * tick,
                                 ttft_mean_s=0.2) for k in range(2))
    now = time.time()
    requests = tuple(RequestSample(now - 5, f"srv{k}", ttft_s=0.05 * (1 + (box + k) % 7), total_s=0.3, prompt_tokens=100,
                                   cached_tokens=60) for k in range(2))
    gpus = tuple(dataclasses.replace(g, ts=now, util_pct=float((tick * 7 + box + g.index) % 100)) for g in base.gpus)
    return dataclasses.replace(base, ts=now, tick=tick, gpus=gpus, servers=servers, requests=requests)


class Moving:
    """Feeds every box a new tick each second (utilisation moves), so the fleet's figures change at the
    scrape interval as a live fleet's do, and the Fleet tab has rows to repaint."""

    def __init__(self, sinks: list, bases: list) -> None:
        self.sinks, self.bases = sinks, bases
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        tick = 2
        while not self.stop.wait(1.0):
            for i, sink in enumerate(self.sinks):
                sink(box_snapshot(self.bases[i], 2 * i, tick))
            tick += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def tab_cpu(url: str, tmp: str, seconds: float, boxes: int) -> tuple[float, float]:
    """CPU share of one core of the real `gpudash launch --sim h200` in a terminal (tmux, 160x48), reading
    the fleet at `url` every second: on the Fleet tab, then on the Events tab (the fleet is read only
    while its tab is on screen: the difference is the tab's cost)."""
    import psutil

    cfg = Path(tmp) / "tab.toml"
    cfg.write_text(f'[sampling]\ninterval_s = 0.5\n\n[probe]\nenabled = false\n\n[fleet]\nprometheus = "{url}"\n')
    session = "fleet-tab"
    tui.tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "48",
             f"exec env -u COLUMNS -u LINES {tui.GPUDASH} --config {cfg} launch --sim h200 --no-record")
    pid = int(tui.tmux("list-panes", "-t", session, "-F", "#{pane_pid}").split()[0])
    try:
        tui.wait_for(session, "GPU0", 60)
        shares = []
        for key, needle in (("0", f"{boxes} of {boxes} boxes"), ("8", "Events")):
            tui.tmux("send-keys", "-t", session, key)
            tui.wait_for(session, needle, 30)
            time.sleep(3)
            proc = psutil.Process(pid)
            c0, t0 = proc.cpu_times(), time.perf_counter()
            time.sleep(seconds)
            c1, t1 = proc.cpu_times(), time.perf_counter()
            shares.append(((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0))
    finally:
        tui.stop(session, pid)
    return shares[0], shares[1]


def command_times(args: list[str], cwd: str, runs: int = 5) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system) of `gpudash ARGS`, `runs` times."""
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", *args], check=True,
                       capture_output=True, cwd=cwd)
        wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, cpu


def host(i: int) -> str:
    return f"127.0.0.{i + 2}"


def no_gpudash_box(i: int, base: Snapshot) -> tuple[list, list[str]]:
    """A box without gpudash: a dcgm-exporter for `base`'s GPUs (UUIDs of its own) and a vLLM's /metrics."""
    gpus = [{"gpu": g.index, "uuid": f"GPU-bench-{i}-{g.index}", "model": g.name, "pci_bus_id": ""}
            for g in base.gpus]
    servers = [dcgm_standin.serve(host(i), 0, dcgm_standin.exposition(gpus, f"box-{i}")),
               dcgm_standin.serve(host(i), 0, VLLM_METRICS)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    return servers, [f"{host(i)}:{srv.server_address[1]}" for srv in servers]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boxes", type=int, default=100)
    ap.add_argument("--cpu-seconds", type=float, default=20.0)
    args = ap.parse_args()
    assert args.boxes <= 250, "one loopback address a box: at most 250"
    snaps = rig_snapshots()
    settings = PrometheusConfig(gpu="all")  # no dcgm-exporter beside these (the other half has only that)
    bases = [snaps[PROFILES[i % len(PROFILES)]] for i in range(args.boxes)]
    sinks = [PrometheusSink(host(i), 0, settings=settings) for i in range(0, args.boxes, 2)]
    others = [no_gpudash_box(i, bases[i]) for i in range(1, args.boxes, 2)]
    gpus = sum(len(b.gpus) for b in bases)
    with tempfile.TemporaryDirectory(prefix="gpudash-bench-fleet-") as tmp:
        jobs = {"gpudash": [f"{s.host}:{s.port}" for s in sinks],
                "dcgm-exporter": [t[0] for _, t in others], "vllm": [t[1] for _, t in others]}
        prom = start_prometheus(Path(tmp) / "prometheus", jobs, interval="2s")
        targets = sum(len(t) for t in jobs.values())
        try:
            for tick in range(2):  # two values per counter, so rate() has something to say
                for n, sink in enumerate(sinks):
                    sink(box_snapshot(bases[2 * n], 2 * n, tick))
                if tick == 0:
                    wait_for(lambda: len(prom.query("up == 1")) == targets, 90, "every target scraped")
                    time.sleep(4.5)
            time.sleep(4.5)
            client = PrometheusClient(prom.url)
            fleet = read_fleet(client)
            assert len(fleet.boxes) == args.boxes and all(b.status == "up" for b in fleet.boxes), \
                [b.status for b in fleet.boxes]
            assert sum(len(b.gpus) for b in fleet.boxes) == gpus and sum(len(b.servers) for b in fleet.boxes) == \
                2 * len(sinks) + len(others)
            inproc = []
            for _ in range(10):
                t0 = time.perf_counter()
                read_fleet(client)
                inproc.append(time.perf_counter() - t0)
            cli, cli_cpu = command_times(["fleet", "--prometheus", prom.url, "--json"], tmp)
            floor, floor_cpu = command_times(["fleet", "--help"], tmp)
            loop = subprocess.run([sys.executable, "-c", REFRESH_LOOP, prom.url, str(args.cpu_seconds)], cwd=tmp,
                                  check=True, capture_output=True, text=True)
            refresh_cpu = float(loop.stdout.strip())
            moving = Moving(sinks, bases[0::2])
            try:
                on_fleet, on_events = tab_cpu(prom.url, tmp, args.cpu_seconds, args.boxes)
            finally:
                moving.close()
        finally:
            stop(prom.proc)
            for s in sinks:
                s.close()
            for servers, _ in others:
                for srv in servers:
                    srv.shutdown()
                    srv.server_close()
    print(f"{args.boxes} boxes ({len(sinks)} with gpudash and 2 servers, {len(others)} with dcgm-exporter and vLLM "
          f"only), {gpus} GPUs, {targets} targets, Prometheus 2.42 scraping every 2 s")
    print(f"{'figure':<52}{'measured':>12}{'target':>10}{'ratio':>8}")
    rows = [("gpudash fleet --json, whole command (median of 5)", statistics.median(cli), 2.0),
            ("  its CPU time, user + system (median of 5)", statistics.median(cli_cpu), 2.0),
            ("  start-up floor: gpudash fleet --help (median of 5)", statistics.median(floor), None),
            ("  its CPU time, user + system (median of 5)", statistics.median(floor_cpu), None),
            ("read_fleet() in process (median of 10)", statistics.median(inproc), 2.0)]
    for name, got, target in rows:
        if target is None:
            print(f"{name:<52}{got:>11.3f}s{'':>10}{'':>8}")
        else:
            print(f"{name:<52}{got:>11.3f}s{target:>9.1f}s{got / target:>8.2f}")
    print(f"{'Fleet refresh at 1 s, CPU of one core':<52}{refresh_cpu * 100:>11.2f}%{2.0:>9.1f}%"
          f"{refresh_cpu * 100 / 2.0:>8.2f}")
    tab = on_fleet - on_events
    print(f"{'gpudash launch (sim h200), on the Fleet tab':<52}{on_fleet * 100:>11.2f}%")
    print(f"{'  the same process on the Events tab':<52}{on_events * 100:>11.2f}%")
    print(f"{'  the Fleet tab itself (difference)':<52}{tab * 100:>11.2f}%{2.0:>9.1f}%{tab * 100 / 2.0:>8.2f}")


if __name__ == "__main__":
    main()
