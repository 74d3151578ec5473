"""EngineSource turns the engine's counters into engine_paths samples for the sampler."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpudash.engine import TransferEngine
from gpudash.records import EnginePathSample
from gpudash.telemetry.engine import EngineSource


def test_engine_source_reports_real_traffic(make_engine: Callable[..., TransferEngine]) -> None:
    eng = make_engine("8xh20")
    src = EngineSource(eng)
    first = src.poll()["engine_paths"]
    assert {s.path for s in first} == {f"direct:{g}" for g in range(8)}  # idle relays are left out
    eng.set(h2d_fallback_bytes=0)
    pinned = eng.alloc_host(64 * 2**20)
    eng.copy(eng.alloc_device(0, 64 * 2**20), pinned).wait()
    rows = src.poll()["engine_paths"]
    assert all(isinstance(r, EnginePathSample) for r in rows)
    h2d = [r for r in rows if r.gpu == 0 and r.direction == "h2d"]
    assert sum(r.bytes_total for r in h2d) == 64 * 2**20
    assert any(r.via is not None and r.chunks_total for r in h2d)
    assert any(r.gbps > 0 for r in h2d)
    assert np.isclose(sum(r.cpu_s for r in h2d), sum(p.cpu_s for p in eng.stats().paths
                                                     if p.gpu == 0 and p.direction == "h2d"), rtol=1e-6)
    src.close()
    eng.stats()  # the engine stays usable: it belongs to the app
