"""A simulated rig for machines without an NVIDIA driver, labelled `sim:<profile>` wherever it shows.

The GPUs and links come from gpudash/engine/profiles.py, the same definitions the engine's sim backend moves
real bytes over, and the PCIe rates are the deltas of that backend's per-GPU link counters: traffic on
a sim rig is caused by real copies (the optional background load is one more engine client, named
`gpudash-sim-load`). Link generation and width are the engine's: degrading one really slows its
copies. Util, power, temperature and clocks are derived from that traffic plus a small
deterministic wobble, so tests can reason about them. The PCIe byte counters are the backend's own link
totals (a sim link has no packet overhead, so its wire bytes are the payload it moved); a sim link never
replays a packet (0), and its only clock event is `gpu_idle`, while it idles at the idle clock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from gpudash.engine.profiles import SimRig, get_profile
from gpudash.gpu.device import CLOCK_EVENT_BIT
from gpudash.records import GpuProcessSample, GpuSample
from gpudash.labels import sim_label, sim_uuid

MiB = 2**20


@dataclass(frozen=True, slots=True)
class LoadLevel:
    """Background copies: `nbytes` per copy; `concurrent` issues every GPU's H2D and D2H at once
    (links busy most of the time), else one copy at a time round-robin with `pause_s` per round."""

    nbytes: int
    concurrent: bool
    pause_s: float


LOAD_LEVELS: dict[str, LoadLevel] = {
    "light": LoadLevel(1 * MiB, concurrent=False, pause_s=1.0),
    "heavy": LoadLevel(32 * MiB, concurrent=True, pause_s=0.0),
}
_BASE_MEM = 480 * MiB  # what an idle driver context would hold
_IDLE_CLOCK_MHZ, _BUSY_CLOCK_MHZ = 345, 1755
# The sim's energy counters start as if the driver had loaded an hour before at idle power, so a reader
# that takes the counter's value for energy spent (not its change) is caught.
_ENERGY_START_S = 3600.0


class SimLoad:
    """Background thread pushing H2D and D2H copies through the engine to every GPU of the rig."""

    def __init__(self, engine: Any, rig: SimRig, level: str) -> None:
        if level not in LOAD_LEVELS:
            raise ValueError(f"unknown sim load {level!r}; choose off, light or heavy")
        self.level = LOAD_LEVELS[level]
        self.nbytes = self.level.nbytes
        self._engine = engine
        # The bytes' content does not matter: D2H copies may land on the same host buffer at once.
        self._src, self._dst = engine.alloc_host(self.nbytes), engine.alloc_host(self.nbytes)
        self.buffers = [engine.alloc_device(i, self.nbytes) for i in range(len(rig.gpus))]
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="gpudash-sim-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _round(self) -> None:
        if self.level.concurrent:
            handles = [self._engine.copy(buf, self._src) for buf in self.buffers]
            handles += [self._engine.copy(self._dst, buf) for buf in self.buffers]
            for h in handles:
                h.wait()
            return
        for buf in self.buffers:
            if self._stop.is_set():
                return
            self._engine.copy(buf, self._src).wait()
            self._engine.copy(self._dst, buf).wait()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._round()
                self._stop.wait(self.level.pause_s)
        except Exception as err:  # the engine was closed under us or refused a copy: say so, stop
            self.error = f"sim load stopped: {err}"

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for buf in [*self.buffers, self._src, self._dst]:
            buf.free()


class SimProcesses:
    """The servers gpudash runs, as processes of the sim GPUs they are configured on: a sim rig's servers
    run on the CPU, so a server's simulated SM utilisation is its process's CPU use since the previous poll
    (% of one core, at most 100), which is what splits a shared sim GPU's energy (server_energy.py)."""

    def __init__(self, pids: Callable[[], dict[int, str]] | None, placement: Mapping[str, tuple[int, ...]]) -> None:
        self._pids = pids
        self._placement = placement
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (monotonic time, CPU seconds) of the last poll

    def poll(self, ts: float, n_gpus: int) -> tuple[GpuProcessSample, ...]:
        if self._pids is None or not self._placement:
            return ()
        out = []
        for pid, server in sorted(self._pids().items()):
            gpus = [g for g in self._placement.get(server, ()) if g < n_gpus]
            if gpus:
                sm = self._sm_pct(pid)
                out.extend(GpuProcessSample(ts=ts, gpu_index=g, pid=pid, used_bytes=None, name=server, server=server,
                                            sm_pct=sm) for g in gpus)
        return tuple(out)

    def _sm_pct(self, pid: int) -> float | None:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            self._cpu.pop(pid, None)
            return None
        now, used = time.monotonic(), t.user + t.system
        last, self._cpu[pid] = self._cpu.get(pid), (now, used)
        if last is None or now <= last[0]:
            return None
        return min(100.0, max(0.0, 100.0 * (used - last[1]) / (now - last[0])))


class SimRigSource:
    """Telemetry source yielding `gpus` for a simulated rig; traffic and link state come from `engine`
    (sim backend). Rates are bytes per *simulated* second (the engine's clock), so a saturated link
    reads its modelled bandwidth however much slower than real time the sim runs."""

    name = "sim"

    def __init__(self, profile_name: str, engine: Any, *, load: str = "off", owns_engine: bool = False,
                 pids: Callable[[], dict[int, str]] | None = None,
                 placement: Mapping[str, tuple[int, ...]] | None = None) -> None:
        """`pids` (pid -> server) and `placement` (server -> the sim GPUs it is configured on) put the servers
        gpudash runs on the sim GPUs as GPU processes, their simulated SM use their real CPU use."""
        self.rig = get_profile(profile_name)
        self._servers = SimProcesses(pids, placement or {})
        self.label = sim_label(profile_name)
        if getattr(engine, "backend", None) != "sim" or getattr(engine, "profile", None) != profile_name:
            raise ValueError(f"{self.label} needs a sim-backend engine built for profile {profile_name!r}, "
                             f"got {engine!r}")
        self.engine = engine
        self._owns_engine = owns_engine
        self._prev: dict[int, tuple[float, int, int]] = {}
        self._tick = 0
        self._energy: dict[int, tuple[float, float]] = {}  # GPU -> (ts, joules) of its simulated energy counter
        self.load: SimLoad | None = None
        if load != "off":
            self.load = SimLoad(engine, self.rig, load)
            self.load.start()

    def link(self, gpu: int) -> tuple[int, int]:
        """The (generation, width) GPU `gpu`'s link currently trains at, as the engine models it."""
        gpus = self.engine.topology().gpus
        if not 0 <= gpu < len(gpus):
            raise ValueError(f"GPU {gpu} does not exist on {self.label}; it has GPUs 0..{len(gpus) - 1}")
        g = gpus[gpu]
        return g.link_gen, g.link_width

    def degrade_link(self, gpu: int, gen: int | None = None, width: int | None = None) -> None:
        """Train GPU `gpu`'s link down (e.g. x8 -> x4; None keeps that part as it is); the engine's sim
        link slows to match. The engine validates and raises a ValueError naming the allowed range."""
        cur_gen, cur_width = self.link(gpu)
        self.engine.set_link(gpu, gen=cur_gen if gen is None else gen, width=cur_width if width is None else width)

    def restore_link(self, gpu: int) -> None:
        """Back to the link the profile says the slot and GPU support."""
        self.engine.set_link(gpu)

    def memory_used(self, gpu: int) -> int:
        """Simulated VRAM in use: an idle context plus the background load's device buffers."""
        load = self.load.nbytes if self.load is not None else 0
        return _BASE_MEM + 16 * MiB * gpu + load

    def poll(self) -> dict[str, tuple]:
        ts = time.time()
        stats = self.engine.stats()
        links = {ls.gpu: ls for ls in stats.links}
        topo = self.engine.topology().gpus
        self._tick += 1
        gpus = []
        for i, g in enumerate(self.rig.gpus):
            info = topo[i]
            ls = links.get(i)
            tx = rx = None
            if ls is not None:
                prev = self._prev.get(i)
                if prev is not None and stats.time_s > prev[0]:
                    dt = stats.time_s - prev[0]
                    rx, tx = (ls.h2d_bytes - prev[1]) / dt, (ls.d2h_bytes - prev[2]) / dt
                self._prev[i] = (stats.time_s, ls.h2d_bytes, ls.d2h_bytes)
            busy = min(1.0, max(tx or 0.0, rx or 0.0) / (info.link_gbps * 1e9))
            util = min(100.0, 2.0 + 60.0 * busy + 1.5 * (1 + math.sin(self._tick / 5.0 + i)))
            power = round(g.power_limit_w * (0.12 + 0.6 * util / 100.0), 1)
            gpus.append(GpuSample(
                ts=ts, index=i, uuid=sim_uuid(self.rig.name, i), name=g.name,
                util_pct=round(util, 1), mem_used=self.memory_used(i), mem_total=g.memory_bytes,
                power_w=power, energy_j=self._energy_j(i, ts, power, g.power_limit_w), energy_source="sim",
                temp_c=round(31.0 + 0.35 * util + i, 1),
                sm_clock_mhz=_BUSY_CLOCK_MHZ if busy > 0.01 else _IDLE_CLOCK_MHZ,
                pcie_tx_bps=tx, pcie_rx_bps=rx, link_gen=info.link_gen, link_width=info.link_width,
                link_gen_max=g.link_gen, link_width_max=g.link_width,
                bar1_total=g.bar1_bytes, bar1_used=8 * MiB,
                pcie_tx_wire_bytes=None if ls is None else ls.d2h_bytes,
                pcie_rx_wire_bytes=None if ls is None else ls.h2d_bytes,
                pcie_replay_errors=0, clock_events=0 if busy > 0.01 else CLOCK_EVENT_BIT["gpu_idle"],
            ))
        out: dict[str, tuple] = {"gpus": tuple(gpus)}
        procs = self._servers.poll(ts, len(gpus))
        if procs:
            out["gpu_processes"] = procs
        if self.load is not None and self.load.error:
            out["errors"] = (f"{self.label}: {self.load.error}",)
        return out

    def _energy_j(self, gpu: int, ts: float, power_w: float, limit_w: float) -> float:
        """GPU `gpu`'s simulated energy counter: the power read now held since the previous read, as that
        power comes from the traffic of the interval just ended (its mean power)."""
        last = self._energy.get(gpu)
        joules = limit_w * 0.12 * _ENERGY_START_S if last is None else last[1] + power_w * max(0.0, ts - last[0])
        self._energy[gpu] = (ts, joules)
        return joules

    def close(self) -> None:
        if self.load is not None:
            self.load.stop()
        if self._owns_engine:
            self.engine.close()
