"""A server's energy: the whole of a GPU it runs on alone, its SM share of one it shares (and the shares sum
to the GPU's energy), nothing guessed where a shared GPU's SM use is unknown, busy apart from idle."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpudash.engine import EngineConfig, TransferEngine
from gpudash.records import GpuProcessSample, GpuSample, ServerSample, Snapshot
from gpudash.telemetry.sampler import Sampler
from gpudash.telemetry.server_energy import ServerEnergyMeter, split_gpu
from gpudash.telemetry.sim import SimRigSource


def test_split_gpu() -> None:
    assert split_gpu(90.0, {"a": None}) == ({"a": 90.0}, "whole_gpu")
    assert split_gpu(90.0, {"a": 20.0, "b": 40.0}) == ({"a": 30.0, "b": 60.0}, "sm_share")
    assert split_gpu(90.0, {"a": 20.0, "b": None}) == ({}, None)  # a share unknown: nothing guessed
    assert split_gpu(90.0, {"a": 0.0, "b": 0.0}) == ({}, None)


def _snap(tick: int, energy: list[float], procs: list[tuple[int, str, float | None]],
          servers: list[tuple[str, float | None, float]]) -> Snapshot:
    ts = 1000.0 + tick
    gpus = tuple(GpuSample(ts, i, f"GPU-{i}", "x", energy_j=e, energy_source="counter") for i, e in enumerate(energy))
    gp = tuple(GpuProcessSample(ts, gpu, 100 + n, None, server=s, sm_pct=sm) for n, (gpu, s, sm) in enumerate(procs))
    sv = tuple(ServerSample(ts, s, "llama.cpp", "ready", requests_running=running, tokens_per_s=tps)
               for s, running, tps in servers)
    return Snapshot(ts, tick, "nvml", gpus=gpus, gpu_processes=gp, servers=sv)


def test_the_meter_splits_and_counts_busy_and_idle_apart() -> None:
    meter = ServerEnergyMeter()
    procs = [(0, "a", 30.0), (0, "b", 10.0), (1, "b", None)]  # GPU 0 shared, GPU 1 b's alone
    assert meter.update(_snap(0, [1e6, 5e5], procs, [("a", 1, 10.0), ("b", 0, 0.0)])) == ()
    (a, b) = meter.update(_snap(1, [1e6 + 400.0, 5e5 + 100.0], procs, [("a", 1, 10.0), ("b", 0, 0.0)]))
    assert (a.busy_j, a.idle_j, a.split, a.gpus) == (300.0, 0.0, "sm_share", "0")
    assert (b.busy_j, b.idle_j, b.split, b.gpus) == (0.0, 200.0, "sm_share", "0,1")
    assert a.generation_tokens == 10.0 and a.j_per_token == 30.0 and a.j_per_token_1m == 30.0
    assert b.j_per_token is None and b.j_per_token_1m is None  # no token: unknown, not 0
    # a's share unknown now: GPU 0's 400 J go to nobody, and each server sharing it says so
    (a, b) = meter.update(_snap(2, [1e6 + 800.0, 5e5 + 200.0], [(0, "a", None), (0, "b", 10.0), (1, "b", None)],
                                [("a", 0, 0.0), ("b", 0, 0.0)]))
    assert (a.busy_j, a.idle_j, a.unattributed_j) == (300.0, 0.0, 400.0)
    assert (b.idle_j, b.unattributed_j) == (300.0, 400.0)


def test_tokens_count_only_from_metrics_reads_and_cover_the_ticks_between() -> None:
    """A tick whose /metrics was not read carries the supervisor's log figure (the last request's decode
    speed) as tokens_per_s: it is no throughput and counts nothing; the next read's rate (its change since
    the read before) covers both ticks."""
    meter = ServerEnergyMeter()
    meter.update(_snap(0, [0.0], [(0, "a", None)], [("a", 0, 0.0)]))
    meter.update(_snap(1, [10.0], [(0, "a", None)], [("a", 0, 0.0)]))
    (a,) = meter.update(_snap(2, [20.0], [(0, "a", None)], [("a", None, 18518.52)]))  # scrape failed
    assert a.generation_tokens == 0.0 and a.idle_j == 20.0
    (a,) = meter.update(_snap(3, [30.0], [(0, "a", None)], [("a", 1, 50.0)]))  # 100 tokens over 2 s
    assert a.generation_tokens == 100.0 and a.busy_j == 10.0


def test_tokens_are_the_change_of_the_servers_own_counts_where_it_reports_them() -> None:
    """A windowed rate (10 s) times a 1 s tick smears a burst over the window; the server's own counts say
    exactly what each tick generated, and a count that went down is a restarted server's new count."""
    def counted(tick: int, rate: float, total: float) -> Snapshot:
        snap = _snap(tick, [100.0 * tick], [(0, "a", None)], [("a", 1, rate)])
        (s,) = snap.servers
        return Snapshot(snap.ts, tick, "nvml", gpus=snap.gpus, gpu_processes=snap.gpu_processes,
                        servers=(ServerSample(s.ts, "a", "llama.cpp", "ready", requests_running=1, tokens_per_s=rate,
                                              generation_tokens_total=total, prompt_tokens_total=2 * total),))
    meter = ServerEnergyMeter()
    meter.update(counted(0, 0.0, 1000.0))
    (a,) = meter.update(counted(1, 50.0, 1500.0))  # a burst of 500 in one tick; the 10 s rate says 50/s
    assert (a.generation_tokens, a.prompt_tokens) == (500.0, 1000.0)
    (a,) = meter.update(counted(2, 50.0, 1500.0))  # nothing new, though the window still holds the burst
    assert a.generation_tokens == 500.0
    (a,) = meter.update(counted(3, 0.0, 30.0))  # restarted: its count began again at 0
    assert a.generation_tokens == 530.0 and a.j_per_token == pytest.approx(300.0 / 530.0)


def test_a_counter_that_goes_down_counts_nothing() -> None:
    meter = ServerEnergyMeter()
    meter.update(_snap(0, [1e6], [(0, "a", None)], [("a", 1, 1.0)]))
    (a,) = meter.update(_snap(1, [10.0], [(0, "a", None)], [("a", 1, 1.0)]))  # the driver reloaded
    assert a.energy_j == 0.0


class _Servers:
    """The servers' states as the supervisor would give them (ready, no traffic): the test's own source."""

    name = "servers"

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def poll(self) -> dict[str, tuple]:
        return {"servers": tuple(ServerSample(time.time(), n, "llama.cpp", "ready", requests_running=0)
                                 for n in self.names)}

    def close(self) -> None:
        pass


BURN = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    pass\n"
NAP = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    t = time.time() + 0.01\n" \
      "    while time.time() < t:\n        pass\n    time.sleep(0.03)\n"


def test_two_servers_on_one_sim_gpu_split_it_and_sum_to_its_energy() -> None:
    """Two real processes as servers "a" and "b" on GPU 0 of the sim rig: a burns a core, b a quarter of
    one; the sim GPU's per-process SM use is their CPU use, so the split is by SM share, a gets more, and
    the two together got exactly what GPU 0's counter grew by over the ticks counted."""
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (BURN, NAP)]
    engine = TransferEngine(EngineConfig(backend="sim", profile="rtx5080+rtx3090"))
    pids = {procs[0].pid: "a", procs[1].pid: "b"}
    src = SimRigSource("rtx5080+rtx3090", engine, pids=lambda: pids, placement={"a": (0,), "b": (0,)})
    sampler = Sampler([src, _Servers(["a", "b"])], interval_s=0.25, source_label=src.label,
                      derive=[ServerEnergyMeter()])
    try:
        snaps = [sampler.poll_once()]
        for _ in range(10):
            time.sleep(0.25)
            snaps.append(sampler.poll_once())
    finally:
        sampler.stop()
        engine.close()
        for p in procs:
            p.kill()
            p.wait()
    last = {e.server: e for e in snaps[-1].server_energy}
    assert set(last) == {"a", "b"} and {e.split for e in last.values()} == {"sm_share"}
    assert all(e.gpus == "0" for e in last.values())
    # every tick's GPU 0 energy went to a, to b, or (the first, with no earlier CPU time to compare) to nobody
    gpu0 = snaps[-1].gpus[0].energy_j - snaps[0].gpus[0].energy_j
    unattributed = last["a"].unattributed_j
    assert last["b"].unattributed_j == unattributed  # they shared GPU 0 alike
    assert last["a"].energy_j + last["b"].energy_j + unattributed == pytest.approx(gpu0, rel=1e-9)
    assert unattributed < gpu0 / 5
    assert last["a"].energy_j > last["b"].energy_j > 0
    assert snaps[-1].gpus[1].energy_j > snaps[0].gpus[1].energy_j  # GPU 1 spent energy too, on nobody
