"""EngineConfig and the live knobs' limits: one table that both construction and `set()` validate against."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from engine.errors import EngineArgumentError
from engine.profiles import PROFILES

GiB = 2**30

# knob -> (low, high) inclusive; bools are checked by type only.
KNOB_LIMITS: dict[str, tuple[int, int]] = {
    "h2d_chunk_bytes": (4096, GiB),
    "d2h_chunk_bytes": (4096, GiB),
    "outstanding": (1, 64),
    "h2d_fallback_bytes": (0, 2**50),
    "d2h_fallback_bytes": (0, 2**50),
    "h2d_staging_bytes": (0, 2**50),  # Python-side policy only: not part of the native knob struct
    "d2h_staging_bytes": (0, 2**50),
    "staging_threads": (1, 64),
    "registration_cache_bytes": (0, 2**50),
}
BOOL_KNOBS = ("direct_first",)
KNOBS = (*KNOB_LIMITS, *BOOL_KNOBS)

# Real host memcpy throughput the sim aims for when it picks its own time scale (GB/s of real time).
SIM_REAL_GBPS = 1.5


def validate_knobs(values: dict[str, Any]) -> dict[str, Any]:
    """Checked copy of `values`; EngineArgumentError naming the first bad knob and its limit."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in BOOL_KNOBS:
            if not isinstance(value, bool):
                raise EngineArgumentError(f"knob {name} must be True or False, got {value!r}")
        elif name in KNOB_LIMITS:
            lo, hi = KNOB_LIMITS[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise EngineArgumentError(f"knob {name} must be an integer in [{lo}, {hi}], got {value!r}")
            if not lo <= value <= hi:
                raise EngineArgumentError(f"knob {name}={value} is out of range; it must be in [{lo}, {hi}]")
        else:
            raise EngineArgumentError(f"unknown knob {name!r}; knobs are: {', '.join(KNOBS)}")
        out[name] = value
    return out


@dataclass(frozen=True)
class EngineConfig:
    """How to build a TransferEngine. Knob defaults are the MMA paper's measured optima, except the
    staging thresholds, which were measured on an H200.

    `h2d_staging_bytes` / `d2h_staging_bytes`: a one-shot pageable host buffer (the first time the engine
    sees it) goes through the pinned staging ring only when the copy is at least this many bytes; smaller
    copies are one plain driver copy of the pageable memory on the single direct path (the driver stages
    it itself; no engine threads), because below these sizes one driver copy measured faster than the
    ring (H200: staging wins H2D only from somewhere in 8-64 MiB, D2H from somewhere in 2-8 MiB; `gpudash
    bench engine --tune` measures this machine's). 0 always stages. They are policy in Python, never
    passed to the native data plane.

    `sim_time_scale`: real seconds per simulated second on the sim backend; None picks one so the
    rig's summed host-link bandwidth needs about SIM_REAL_GBPS of real memcpy throughput.
    """

    backend: str = "sim"
    profile: str = "h200"
    h2d_chunk_bytes: int = 2_810_000
    d2h_chunk_bytes: int = 5_370_000
    outstanding: int = 2
    h2d_fallback_bytes: int = 11_300_000
    d2h_fallback_bytes: int = 13_000_000
    h2d_staging_bytes: int = 16 * 2**20
    d2h_staging_bytes: int = 4 * 2**20
    direct_first: bool = True
    staging_threads: int = 4
    registration_cache_bytes: int = 8 * GiB
    sim_time_scale: float | None = None

    def __post_init__(self) -> None:
        if self.backend not in ("sim", "cuda"):
            raise EngineArgumentError(f"backend must be 'sim' or 'cuda', got {self.backend!r}")
        if self.backend == "sim" and self.profile not in PROFILES:
            raise EngineArgumentError(f"unknown sim profile {self.profile!r}; choose one of: {', '.join(PROFILES)}")
        if self.sim_time_scale is not None and not (isinstance(self.sim_time_scale, (int, float))
                                                    and 0 < self.sim_time_scale <= 1e6):
            raise EngineArgumentError(f"sim_time_scale must be in (0, 1e6], got {self.sim_time_scale!r}")
        validate_knobs(self.knobs())

    def knobs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in KNOBS}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
