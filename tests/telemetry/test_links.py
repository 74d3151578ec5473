"""A GPU's host link as a sample shows it (gpudash/telemetry/links.py): its share against the link's current
capacity, and a downgrade warning only while the GPU is busy."""

from __future__ import annotations

from dataclasses import replace

from gpudash.records import GpuSample
from gpudash.telemetry.links import link_capacity_bps, link_status

H20 = GpuSample(0.0, 0, "u", "NVIDIA H20", util_pct=2.0, pcie_tx_bps=0.0, pcie_rx_bps=0.0, link_gen=5,
                link_width=16, link_gen_max=5, link_width_max=16)


def test_downgrade_warns_only_when_busy() -> None:
    idle_low = replace(H20, link_gen=1)  # GPUs train down at idle by design: no warning
    assert link_status(idle_low).below_max and not link_status(idle_low).warn
    busy_low = replace(idle_low, util_pct=90.0)
    assert link_status(busy_low).warn
    traffic_narrow = replace(H20, link_width=8, pcie_rx_bps=20e9)
    assert link_status(traffic_narrow).warn
    assert not link_status(replace(H20, util_pct=90.0, pcie_rx_bps=50e9)).warn  # busy at max: fine


def test_link_share_is_against_the_current_gen_and_width() -> None:
    g = replace(H20, pcie_tx_bps=27.4e9, link_width=8)  # gen5 x8 carries 3.938 * 8 * 0.87 = 27.4 GB/s
    assert abs(link_status(g).tx_fraction - 1.0) < 0.01
    assert link_status(replace(H20, link_gen=None)).tx_fraction is None  # unknown link: NA, not zero


def test_capacity_is_unknown_for_an_unknown_link() -> None:
    assert link_capacity_bps(None, 16) is None and link_capacity_bps(5, 0) is None
    assert link_capacity_bps(9, 16) is None  # a generation the table does not know: NA, not a guess
    assert abs(link_capacity_bps(4, 8) - 1.969 * 8 * 0.87 * 1e9) < 1e3
