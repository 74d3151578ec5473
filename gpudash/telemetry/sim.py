"""A simulated rig for machines without an NVIDIA driver, labelled `sim:<profile>` wherever it shows.

The GPUs and links come from engine/profiles.py, the same definitions the engine's sim backend moves
real bytes over, and the PCIe rates are the deltas of that backend's per-GPU link counters: traffic on
a sim rig is caused by real copies (the optional background load is one more engine client, named
`gpudash-sim-load`). Util, power, temperature and clocks are derived from that traffic plus a small
deterministic wobble, so tests can reason about them.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np

from engine.profiles import SimRig, get_profile, pcie_payload_gbps
from gpudash.records import GpuSample
from gpudash.telemetry.topology import sim_uuid

MiB = 2**20
# Background copies per load level: (bytes per copy, pause between rounds in seconds).
LOAD_LEVELS: dict[str, tuple[int, float]] = {"light": (4 * MiB, 0.2), "heavy": (64 * MiB, 0.0)}
_BASE_MEM = 480 * MiB  # what an idle driver context would hold
_IDLE_CLOCK_MHZ, _BUSY_CLOCK_MHZ = 345, 1755


class SimLoad:
    """Background thread pushing H2D then D2H copies through the engine, round-robin over the GPUs."""

    def __init__(self, engine: Any, rig: SimRig, level: str) -> None:
        if level not in LOAD_LEVELS:
            raise ValueError(f"unknown sim load {level!r}; choose off, light or heavy")
        self.nbytes, self.pause_s = LOAD_LEVELS[level]
        self._engine = engine
        self._host = np.zeros(self.nbytes, dtype=np.uint8)
        self.buffers = [engine.alloc_device(i, self.nbytes) for i in range(len(rig.gpus))]
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="gpudash-sim-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for buf in self.buffers:
                    if self._stop.is_set():
                        return
                    self._engine.copy(buf, self._host).wait()
                    self._engine.copy(self._host, buf).wait()
                self._stop.wait(self.pause_s)
        except Exception as err:  # the engine was closed under us or refused a copy: say so, stop
            self.error = f"sim load stopped: {err}"

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class SimRigSource:
    """Telemetry source yielding `gpus` for a simulated rig; traffic comes from `engine` (sim backend)."""

    name = "sim"

    def __init__(self, profile_name: str, engine: Any, *, load: str = "off", owns_engine: bool = False) -> None:
        self.rig = get_profile(profile_name)
        self.label = f"sim:{profile_name}"
        self.engine = engine
        self._owns_engine = owns_engine
        self._lock = threading.Lock()
        self._links = [(g.link_gen, g.link_width) for g in self.rig.gpus]
        self._prev: dict[int, tuple[float, int, int]] = {}
        self._tick = 0
        self.load: SimLoad | None = None
        if load != "off":
            self.load = SimLoad(engine, self.rig, load)
            self.load.start()

    def _check_gpu(self, gpu: int) -> None:
        if not 0 <= gpu < len(self.rig.gpus):
            raise ValueError(f"GPU {gpu} does not exist on {self.label}; it has GPUs 0..{len(self.rig.gpus) - 1}")

    def link(self, gpu: int) -> tuple[int, int]:
        """The (generation, width) GPU `gpu`'s link currently trains at."""
        self._check_gpu(gpu)
        with self._lock:
            return self._links[gpu]

    def degrade_link(self, gpu: int, gen: int | None = None, width: int | None = None) -> None:
        """Train GPU `gpu`'s link down (e.g. x8 -> x4); the engine's sim link slows down to match."""
        self._check_gpu(gpu)
        top = self.rig.gpus[gpu]
        cur_gen, cur_width = self.link(gpu)
        new_gen, new_width = gen or cur_gen, width or cur_width
        if not 1 <= new_gen <= top.link_gen or new_width not in (1, 2, 4, 8, 16) or new_width > top.link_width:
            raise ValueError(f"GPU {gpu} on {self.label} can train at gen1..{top.link_gen} and width "
                             f"x1..x{top.link_width} (powers of two); got gen{new_gen} x{new_width}")
        self.engine.set_link(gpu, gen=new_gen, width=new_width)
        with self._lock:
            self._links[gpu] = (new_gen, new_width)

    def restore_link(self, gpu: int) -> None:
        """Back to the link the profile says the slot and GPU support."""
        self._check_gpu(gpu)
        top = self.rig.gpus[gpu]
        self.engine.set_link(gpu, gen=top.link_gen, width=top.link_width)
        with self._lock:
            self._links[gpu] = (top.link_gen, top.link_width)

    def memory_used(self, gpu: int) -> int:
        """Simulated VRAM in use: an idle context plus the background load's device buffers."""
        load = self.load.nbytes if self.load is not None else 0
        return _BASE_MEM + 16 * MiB * gpu + load

    def poll(self) -> dict[str, tuple]:
        ts, now = time.time(), time.monotonic()
        links = {ls.gpu: ls for ls in self.engine.stats().links}
        self._tick += 1
        gpus = []
        for i, g in enumerate(self.rig.gpus):
            gen, width = self.link(i)
            ls = links.get(i)
            tx = rx = None
            if ls is not None:
                prev = self._prev.get(i)
                if prev is not None and now > prev[0]:
                    rx = (ls.h2d_bytes - prev[1]) / (now - prev[0])
                    tx = (ls.d2h_bytes - prev[2]) / (now - prev[0])
                self._prev[i] = (now, ls.h2d_bytes, ls.d2h_bytes)
            busy = min(1.0, max(tx or 0.0, rx or 0.0) / (pcie_payload_gbps(gen, width) * 1e9))
            util = min(100.0, 2.0 + 60.0 * busy + 1.5 * (1 + math.sin(self._tick / 5.0 + i)))
            gpus.append(GpuSample(
                ts=ts, index=i, uuid=sim_uuid(self.rig.name, i), name=g.name,
                util_pct=round(util, 1), mem_used=self.memory_used(i), mem_total=g.memory_bytes,
                power_w=round(g.power_limit_w * (0.12 + 0.6 * util / 100.0), 1),
                temp_c=round(31.0 + 0.35 * util + i, 1),
                sm_clock_mhz=_BUSY_CLOCK_MHZ if busy > 0.01 else _IDLE_CLOCK_MHZ,
                pcie_tx_bps=tx, pcie_rx_bps=rx, link_gen=gen, link_width=width,
                link_gen_max=g.link_gen, link_width_max=g.link_width,
                bar1_total=g.bar1_bytes, bar1_used=8 * MiB,
            ))
        out: dict[str, tuple] = {"gpus": tuple(gpus)}
        if self.load is not None and self.load.error:
            out["errors"] = (f"{self.label}: {self.load.error}",)
        return out

    def close(self) -> None:
        if self.load is not None:
            self.load.stop()
        if self._owns_engine:
            self.engine.close()
