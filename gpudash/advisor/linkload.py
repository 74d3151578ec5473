"""A short engine load so PCIe links are read while busy (idle links drop speed by design).

One thread per GPU pushes host-to-device copies below the engine's fallback size, so each copy takes
that GPU's own direct link; halfway through, the topology (link generation/width) is read, and the
engine's per-link byte counters over its own clock (sim time on a sim rig) give what each link
actually carried during the window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpudash.engine.profiles import pcie_payload_gbps
from gpudash.advisor.facts import LinkLoad
from gpudash.telemetry.topology import TopologyFacts

LOAD_COPY_BYTES = 8 * 2**20  # below the default 11.3 MB H2D fallback: the direct path only
WARMUP_S = 0.05


def _h2d_bytes(engine: Any) -> tuple[float, dict[int, int]]:
    """The engine's clock (sim time on the sim backend) and each GPU link's cumulative H2D bytes."""
    st = engine.stats()
    return st.time_s, {ls.gpu: ls.h2d_bytes for ls in st.links}


def links_under_load(engine: Any, gpus: Sequence[int], read: Callable[[], TopologyFacts],
                     seconds: float = 0.4, nbytes: int = LOAD_COPY_BYTES) -> tuple[TopologyFacts, tuple[LinkLoad, ...]]:
    """Copy to every GPU for `seconds`, read the topology mid-way; the facts seen and each link's GB/s."""
    host = np.ones(nbytes, dtype=np.uint8)
    buffers = {i: engine.alloc_device(i, nbytes) for i in gpus}
    stop = threading.Event()
    errors: list[str] = []

    def pump(buf: Any) -> None:
        try:
            while not stop.is_set():
                engine.copy(buf, host).wait()
        except Exception as err:  # report it after the load instead of dying silently in a thread
            errors.append(str(err))

    threads = [threading.Thread(target=pump, args=(b,), name=f"gpudash-doctor-load-{i}", daemon=True)
               for i, b in buffers.items()]
    for t in threads:
        t.start()
    try:
        time.sleep(WARMUP_S)
        t0, b0 = _h2d_bytes(engine)
        time.sleep(seconds / 2)
        topo = read()
        time.sleep(seconds / 2)
        t1, b1 = _h2d_bytes(engine)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    if errors:
        raise RuntimeError(f"the engine load failed: {errors[0]}")
    loads = []
    for g in topo.gpus:
        if g.index not in buffers:
            continue
        top = (pcie_payload_gbps(g.link_gen_max, g.link_width_max)
               if g.link_gen_max and g.link_width_max else None)
        moved = b1.get(g.index, 0) - b0.get(g.index, 0)
        loads.append(LinkLoad(g.index, moved / (t1 - t0) / 1e9, top))
    return topo, tuple(loads)
