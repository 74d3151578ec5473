"""A GPU's host link as a sample shows it: what the link can carry at its current generation and width,
the share of that the GPU's traffic uses, and whether a link below its maximum deserves a warning.
Read by the dashboard's views and by `gpudash status`, from records alone."""

from __future__ import annotations

from dataclasses import dataclass

from gpudash.engine.profiles import pcie_payload_gbps
from gpudash.records import GpuSample

# A link below its max generation/width is only worth a warning when it carries traffic or the GPU works:
# GPUs drop link speed at idle by design.
BUSY_UTIL_PCT = 10.0
BUSY_LINK_FRACTION = 0.02


def link_capacity_bps(gen: int | None, width: int | None) -> float | None:
    """Payload bytes/s one direction of the link can carry at this gen/width, or None when unknown."""
    if not gen or not width:
        return None
    try:
        return pcie_payload_gbps(gen, width) * 1e9
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class LinkStatus:
    """A GPU's host link as the card shows it."""

    text: str  # "gen5x16 (max gen5x16)"
    below_max: bool
    busy: bool
    tx_fraction: float | None
    rx_fraction: float | None

    @property
    def warn(self) -> bool:
        """Downgrade warning: below max while busy (never at idle)."""
        return self.below_max and self.busy


def link_status(g: GpuSample) -> LinkStatus:
    """Current vs max link, the share of the current link's capacity used, and whether to warn."""
    cap = link_capacity_bps(g.link_gen, g.link_width)
    tx = g.pcie_tx_bps / cap if cap and g.pcie_tx_bps is not None else None
    rx = g.pcie_rx_bps / cap if cap and g.pcie_rx_bps is not None else None
    below = bool(
        (g.link_gen and g.link_gen_max and g.link_gen < g.link_gen_max)
        or (g.link_width and g.link_width_max and g.link_width < g.link_width_max)
    )
    busy = (g.util_pct or 0.0) >= BUSY_UTIL_PCT or max(tx or 0.0, rx or 0.0) >= BUSY_LINK_FRACTION
    cur = f"gen{g.link_gen or '?'}x{g.link_width or '?'}"
    mx = f"gen{g.link_gen_max or '?'}x{g.link_width_max or '?'}"
    return LinkStatus(f"{cur} (max {mx})", below, busy, tx, rx)
