"""The engine's knob table and EngineConfig: one row per knob (name, default, range, unit, doc, whether it
is live, its C type), from which everything else that names a knob is derived: EngineConfig's fields,
the engine's validation, the ctypes `Knobs` struct, gpudash's `[engine]` settings, its control and knob
form, and csrc/knob_limits.h (the C++ range check). Adding a knob is one row here (plus, for a native
knob, its field in ge_knobs, which a compile-time check holds to this table's layout)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from typing import Any

from gpudash.engine.errors import EngineArgumentError
from gpudash.engine.profiles import PROFILES

GiB = 2**30
MAX_BYTES = 2**50

# Real host memcpy throughput the sim aims for when it picks its own time scale (GB/s of real time).
SIM_REAL_GBPS = 1.5

# C types a native knob may have in ge_knobs, with their size in bytes.
C_TYPES = {"uint64_t": 8, "int32_t": 4}


@dataclass(frozen=True)
class Knob:
    """One engine knob. `native` is its C type in ge_knobs (None: policy in Python only); `live` knobs
    reach a running engine, in this process and in a preloaded one, and the dashboard's knob form edits
    them; `what` names the knob in messages and `zero_means` says what 0 does, where it is special."""

    name: str
    default: int | bool
    low: int
    high: int
    unit: str  # "bytes", a plural noun ("chunks", "threads"), or "bool"
    doc: str
    live: bool = True
    native: str | None = None
    what: str = ""
    zero_means: str = ""
    machine_default: bool = False  # the default is computed where the engine runs (a preloaded one too)

    @property
    def is_bool(self) -> bool:
        return self.unit == "bool"

    @property
    def is_size(self) -> bool:
        return self.unit == "bytes"

    def limits_text(self) -> str:
        """'between 4 KiB and 1 GiB', as messages say it."""
        low = _amount(self.low, self.is_size) + (f" ({self.zero_means})" if self.low == 0 and self.zero_means else "")
        return f"between {low} and {_amount(self.high, self.is_size)}"

    def check(self, value: Any) -> int | bool:
        """`value` when this knob takes it, else KnobValueError: the one rule for a knob's value (its type
        and range), which EngineConfig, TransferEngine.set, the preload's knob block and gpudash's
        [engine] settings all apply (gpudash.config.parse_knobs for values a person types), and whose
        limits csrc/knob_limits.h carries to the C++ check."""
        name, label = self.name, self.what or self.name
        if self.is_bool:
            if not isinstance(value, bool):
                raise KnobValueError(f"knob {name} must be True or False, got {value!r}",
                                     f"{label} must be true or false, got {value!r}")
            return value
        lo, hi = self.low, self.high
        if isinstance(value, bool) or not isinstance(value, int):
            raise KnobValueError(f"knob {name} must be an integer in [{lo}, {hi}], got {value!r}",
                                 f"{label} must be a whole number {self.limits_text()}, got {value!r}")
        if not lo <= value <= hi:
            unit = " bytes" if self.is_size else ""
            raise KnobValueError(f"knob {name}={value} is out of range; it must be in [{lo}, {hi}]",
                                 f"{label} must be {self.limits_text()}, got {value}{unit}")
        return value


class KnobValueError(EngineArgumentError):
    """A value a knob does not take (Knob.check). The message speaks to a caller of the engine's API
    ("knob outstanding=0 is out of range; it must be in [1, 64]"); `reason` says the same to a person
    editing a config file or a form ("outstanding must be between 1 and 64, got 0")."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _amount(n: int, size: bool) -> str:
    if not size:
        return str(n)
    if n and n >= 2**40 and n & (n - 1) == 0:
        return f"2**{n.bit_length() - 1} bytes"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n}" if n == 0 else f"{n} bytes"


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_staging_threads(cores: int | None = None) -> int:
    """Half the usable cores, 1 to 16: on an H200 box with 16 cores, 8-16 memcpy threads moved one-shot
    pageable copies at 44-45 GB/s where 4 managed 25; the other half is left to the caller's threads."""
    return max(1, min(16, (usable_cores() if cores is None else cores) // 2))


# The knob table, in the order settings and forms show them. The C layout of ge_knobs is the native
# knobs, wider types first, each type in this order, padded to 8 bytes with `reserved` (see c_layout).
KNOB_TABLE: tuple[Knob, ...] = (
    Knob("h2d_chunk_bytes", 2_810_000, 4096, GiB, "bytes",
         "Chunk size for host-to-device copies; 2.81 MB is what the MMA multipath-transfer paper found best.",
         native="uint64_t", what="chunk size"),
    Knob("d2h_chunk_bytes", 5_370_000, 4096, GiB, "bytes",
         "Chunk size for device-to-host copies; 5.37 MB is what the MMA multipath-transfer paper found best.",
         native="uint64_t", what="chunk size"),
    Knob("outstanding", 2, 1, 64, "chunks",
         "Chunks a path may have in flight at once; 2 is what the MMA multipath-transfer paper found best.",
         native="int32_t"),
    Knob("h2d_fallback_bytes", 11_300_000, 0, MAX_BYTES, "bytes",
         "H2D copies smaller than this take the single direct path; the MMA multipath-transfer paper measured "
         "the crossover at 11.3 MB.", native="uint64_t",
         what="fallback threshold", zero_means="always multipath"),
    Knob("d2h_fallback_bytes", 13_000_000, 0, MAX_BYTES, "bytes",
         "D2H copies smaller than this take the single direct path; the MMA multipath-transfer paper measured "
         "the crossover at 13 MB.", native="uint64_t",
         what="fallback threshold", zero_means="always multipath"),
    Knob("h2d_staging_bytes", 1 * 2**20, 0, MAX_BYTES, "bytes",
         "One-shot pageable H2D copies of at least this size go through the pinned staging ring; smaller "
         "ones are one plain driver copy on the direct path, which measured faster (H200: staging wins "
         "from 1 MiB, benchmarks/results/bench_preload_sizes_h200.txt). 0 always stages.",
         what="staging threshold", zero_means="always stage"),
    Knob("d2h_staging_bytes", 2 * 2**20, 0, MAX_BYTES, "bytes",
         "One-shot pageable D2H copies of at least this size go through the pinned staging ring; smaller "
         "ones are one plain driver copy on the direct path, which measured faster (H200: staging wins "
         "from 2 MiB, benchmarks/results/bench_preload_sizes_h200.txt). 0 always stages.",
         what="staging threshold", zero_means="always stage"),
    Knob("direct_first", True, 0, 1, "bool",
         "Use the target GPU's own PCIe link first; relays join only when its queue is full.",
         native="int32_t"),
    Knob("staging_threads", default_staging_threads(), 1, 64, "threads",
         "memcpy threads filling the pinned staging ring for pageable copies. Default: half the cores this "
         "process may use (sched_getaffinity), 1 to 16.", native="int32_t", machine_default=True),
    Knob("registration_cache_bytes", 8 * GiB, 0, MAX_BYTES, "bytes",
         "Byte cap of the pageable-memory registration cache (LRU); set per engine, not carried to a "
         "preloaded process.", live=False, what="registration cache cap"),
)
KNOB = {k.name: k for k in KNOB_TABLE}
KNOBS = tuple(KNOB)


def c_layout() -> tuple[tuple[str, str, int], ...]:
    """(field, C type, byte offset) of ge_knobs: the native knobs, wider types first (table order within
    a type), then int32 `reserved` fields up to a multiple of 8 bytes."""
    native = sorted((k for k in KNOB_TABLE if k.native), key=lambda k: -C_TYPES[k.native or ""])
    out, offset = [], 0
    for k in native:
        out.append((k.name, k.native or "", offset))
        offset += C_TYPES[k.native or ""]
    pads = 0
    while offset % 8:
        out.append(("reserved" if pads == 0 else f"reserved{pads}", "int32_t", offset))
        offset, pads = offset + 4, pads + 1
    return tuple(out)


def validate_knobs(values: dict[str, Any]) -> dict[str, Any]:
    """Checked copy of `values` (each by its row's Knob.check); EngineArgumentError naming the first bad
    knob and its limit."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        knob = KNOB.get(name)
        if knob is None:
            raise EngineArgumentError(f"unknown knob {name!r}; knobs are: {', '.join(KNOBS)}")
        out[name] = knob.check(value)
    return out


class _EngineConfigMethods:
    backend: str
    profile: str
    sim_time_scale: float | None

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
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in KNOB}  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


EngineConfig = make_dataclass(
    "EngineConfig",
    [("backend", str, field(default="sim")), ("profile", str, field(default="h200")),
     *[(k.name, bool if k.is_bool else int, field(default=k.default)) for k in KNOB_TABLE],
     ("sim_time_scale", float | None, field(default=None))],
    bases=(_EngineConfigMethods,), frozen=True)
EngineConfig.__module__ = __name__
EngineConfig.__doc__ = """How to build a TransferEngine: the backend, the sim profile, one field per row of
KNOB_TABLE (defaults: the MMA paper's measured optima, the staging thresholds measured on an H200), and
`sim_time_scale`: real seconds per simulated second on the sim backend; None picks one so the rig's
summed host-link bandwidth needs about SIM_REAL_GBPS of real memcpy throughput."""
