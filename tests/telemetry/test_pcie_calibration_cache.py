"""The calibration verdict and its per-GPU cache (the CuPy copy itself runs in tests/gpu)."""

from __future__ import annotations

from pathlib import Path

from gpudash.telemetry.pcie_cache import Calibration, cached_overhead, load_all, save

GB = 10**9


def _cal(uuid: str, rx: int, tx: int) -> Calibration:
    return Calibration(uuid=uuid, payload_bytes=GB, rx_counted=rx, tx_counted=tx, h2d_gbps=53.0, d2h_gbps=54.0)


def test_verdict_accepts_packet_overhead_and_rejects_other_units() -> None:
    good = _cal("GPU-a", int(1.085 * GB), int(1.095 * GB))
    assert good.trusted and abs(good.wire_overhead - 1.09) < 1e-9
    assert not _cal("GPU-b", GB // 1024, GB // 1024).trusted  # a KiB counter
    assert not _cal("GPU-c", int(1.09 * GB), 0).trusted  # one direction never moved


def test_cache_keeps_each_gpu_and_ignores_untrusted_or_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    save(_cal("GPU-a", int(1.08 * GB), int(1.10 * GB)), path)
    save(_cal("GPU-b", GB // 1024, GB // 1024), path)
    assert set(load_all(path)) == {"GPU-a", "GPU-b"}
    assert abs(cached_overhead("GPU-a", path) - 1.09) < 1e-9
    assert cached_overhead("GPU-b", path) is None and cached_overhead("GPU-x", path) is None
    path.write_text("{not json")
    assert load_all(path) == {} and cached_overhead("GPU-a", path) is None
