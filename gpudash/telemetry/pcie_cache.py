"""The PCIe counter calibrations measured on this machine, cached per GPU UUID in the user cache
directory: written by `python -m gpudash.telemetry.pcie_calibration`, read by `NvmlSource` (so the
source and the calibration tool do not import each other)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import platformdirs

from gpudash.private_fs import private_dir, read_capped, write_atomic

# A wire/payload ratio outside this range means the counters do not count bytes the way we think.
PLAUSIBLE_OVERHEAD = (1.0, 1.35)
CACHE_CAP = 1 << 20  # bytes: a calibration is a few hundred per GPU


@dataclass(frozen=True, slots=True)
class Calibration:
    """What one calibration run measured on one GPU."""

    uuid: str
    payload_bytes: int  # per direction
    rx_counted: int  # counter delta during the host->device copies
    tx_counted: int  # counter delta during the device->host copies
    h2d_gbps: float  # payload GB/s the copies reached
    d2h_gbps: float

    @property
    def rx_overhead(self) -> float:
        return self.rx_counted / self.payload_bytes

    @property
    def tx_overhead(self) -> float:
        return self.tx_counted / self.payload_bytes

    @property
    def wire_overhead(self) -> float:
        """Wire bytes per payload byte, averaged over both directions."""
        return (self.rx_overhead + self.tx_overhead) / 2

    @property
    def trusted(self) -> bool:
        lo, hi = PLAUSIBLE_OVERHEAD
        return lo <= self.rx_overhead <= hi and lo <= self.tx_overhead <= hi


def cache_path() -> Path:
    return Path(platformdirs.user_cache_dir("gpudash")) / "pcie_calibration.json"


def save(cal: Calibration, path: Path | None = None) -> Path:
    """Store a calibration under its GPU's UUID (other GPUs' entries are kept); only trusted ones are used."""
    p = path or cache_path()
    data = load_all(p)
    data[cal.uuid] = asdict(cal)
    private_dir(p.parent)
    return write_atomic(p, json.dumps(data, indent=2))


def load_all(path: Path | None = None) -> dict[str, dict]:
    p = path or cache_path()
    try:
        data = json.loads(read_capped(p, CACHE_CAP))
    except (OSError, ValueError):  # absent, or a link, FIFO or oversized file where the cache should be
        return {}
    return data if isinstance(data, dict) else {}


def cached_overhead(uuid: str, path: Path | None = None) -> float | None:
    """The wire overhead measured earlier for this GPU, if a trusted calibration is cached."""
    entry = load_all(path).get(uuid)
    if not isinstance(entry, dict):
        return None
    try:
        cal = Calibration(**entry)
    except TypeError:
        return None
    return cal.wire_overhead if cal.trusted else None
