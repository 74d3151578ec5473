"""Fixed data for the TUI tests: snapshots of a sim rig built from gpudash.engine.profiles, and a feed that
hands them over (the app takes its data source by injection)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from gpudash.engine.profiles import get_profile
from gpudash.config import ServerSpec
from gpudash.records import (EnginePathSample, Event, GpuProcessSample, GpuSample, HostSample, PoolSample,
                             PoolShardSample, RequestSample, ServerSample, Snapshot)
from gpudash.runtime.feed import FeedInfo

T0 = 1_800_000_000.0
# pids no process can have (Linux's pid_max is at most 2**22): the Processes tab's user/command look-up
# finds nobody, so what the tables show stays the same from run to run
BIG_PID, SMALL_PID = 2**22 + 4242, 2**22 + 4343
SPECS = {
    "big": ServerSpec(name="big", model="/models/big.gguf", gpus=[0, 1], tensor_split=[2, 3], port=8081),
    "small": ServerSpec(name="small", model="/models/small.gguf", gpus=[2], port=8082),
}


def sim_snapshot(profile: str = "8xh20", tick: int = 0, degrade: int | None = None) -> Snapshot:
    """One deterministic tick of a sim rig: utilisation, PCIe traffic, servers, requests, pools."""
    rig = get_profile(profile)
    ts = T0 + tick
    held = {0: 7 * 2**30, 1: 9 * 2**30}  # what `big`'s llama-server holds on GPUs 0 and 1 (counted in mem_used)
    gpus = []
    for i, g in enumerate(rig.gpus):
        busy = (i + tick) % 3 != 0
        gen, width = (g.link_gen, g.link_width) if degrade != i else (g.link_gen, g.link_width // 2)
        gpus.append(GpuSample(ts, i, f"GPU-sim-{i}", g.name, util_pct=80.0 if busy else 3.0,
                              mem_used=(i + 1) * 2**30 * 4 + held.get(i, 0), mem_total=g.memory_bytes,
                              power_w=100.0 + 10 * i, temp_c=40.0 + i, sm_clock_mhz=1500, pcie_tx_bps=(1 + (tick + i) % 5) * 2e9,
                              pcie_rx_bps=(1 + (tick * 2 + i) % 4) * 1e9, link_gen=gen, link_width=width,
                              link_gen_max=g.link_gen, link_width_max=g.link_width, bar1_total=g.bar1_bytes))
    procs = tuple(GpuProcessSample(ts, gi, BIG_PID, used, "llama-server", "big")
                  for gi, used in held.items() if gi < len(gpus))
    servers = (ServerSample(ts, "big", "llama.cpp", "ready", BIG_PID, 8081, 120.0 + tick, 0, 55.5, 900.0, 1, 0, 0.25),
               ServerSample(ts, "small", "llama.cpp", "loading", SMALL_PID, 8082, None, 1))
    reqs = tuple(RequestSample(ts + k * 0.1, "big", 0.02 + 0.05 * ((tick + k) % 2), 0.3, 256,
                               200 if (tick + k) % 2 == 0 else 10, 16) for k in range(2))
    paths = (EnginePathSample(ts, "direct:0", 0, None, "h2d", 10**9 * (tick + 1), 100 * (tick + 1), 2, 48.5, 0.1),
             EnginePathSample(ts, "relay:1->0", 0, 1, "h2d", 10**8 * (tick + 1), 10 * (tick + 1), 1, 12.0, 0.02))
    pools = (PoolSample(ts, "pinned", 2**31, 2**30), PoolSample(ts, "sim-gpu0", 8 * 2**30, 0))
    shards = (PoolShardSample(ts, "pinned", "numa0", 2**30, 2**29, 2**29, 2**28, 3, 0.5, 0),
              PoolShardSample(ts, "sim-gpu0", "kv", 6 * 2**30, 5 * 2**30, 2**30, 2**30, 1, 0.0, 0),
              PoolShardSample(ts, "sim-gpu0", "staging", 2 * 2**30, 0, 2 * 2**30, 2 * 2**30, 1, 0.0, 0))
    events = (Event(ts, "supervisor", "server.ready", "big", "loading", "ready"),) if tick == 1 else ()
    return Snapshot(ts, tick, f"sim:{profile}", tuple(gpus),
                    HostSample(ts, 25.0, 40 * 2**30, 256 * 2**30, rig.numa_nodes, 3.0, 120 * 2**20),
                    procs, (), paths, pools=pools, pool_shards=shards, servers=servers, requests=reqs, events=events)


class FixedFeed:
    """Hands a fixed list of snapshots to the app synchronously at start (stable output for snapshots)."""

    def __init__(self, snaps: list[Snapshot], specs: dict | None = None, controller=None,
                 knobs: dict | None = None, cpu: dict[str, str] | None = None, demo: str | None = None) -> None:
        self.snaps = snaps
        self.cpu = cpu or {}
        self.demo = demo  # the server that stands for the embedded demo
        self.source = snaps[0].source if snaps else "sim:8xh20"
        self.specs = SPECS if specs is None else specs
        self.controller = controller
        self.knobs = knobs or {"h2d_chunk_bytes": 2_810_000, "d2h_chunk_bytes": 5_370_000, "outstanding": 2,
                               "h2d_fallback_bytes": 11_300_000, "d2h_fallback_bytes": 13_000_000,
                               "h2d_staging_bytes": 16 * 2**20, "d2h_staging_bytes": 4 * 2**20,
                               "direct_first": True, "staging_threads": 4}
        self.closed = False

    def start(self, deliver: Callable[[Snapshot], None]) -> FeedInfo:
        for s in self.snaps:
            deliver(s)
        return FeedInfo(self.source, "/tmp/gpudash-test.db", False, self.controller, dict(self.specs),
                        dict(self.knobs), demo=self.demo)

    def start_servers(self) -> list[str]:
        return []

    def want_engine(self) -> list[str]:
        return []

    def cpu_builds(self) -> dict[str, str]:
        return dict(self.cpu)  # the fixed servers run no binary: their build is what the test says

    def close(self) -> None:
        self.closed = True


class OneSessionFeed(FixedFeed):
    """A FixedFeed whose run records into a real SQLite file holding one ended session (History lists it)."""

    def __init__(self, snaps: list[Snapshot], db: Path) -> None:
        super().__init__(snaps)
        from gpudash.config import Config
        from gpudash.store import Store

        with Store.open(db) as store:
            store.end_session(store.begin_session("sim:h200", Config(), note="gpudash record"))
        self.db = db

    def start(self, deliver: Callable[[Snapshot], None]) -> FeedInfo:
        info = super().start(deliver)
        info.db_path = str(self.db)
        return info
