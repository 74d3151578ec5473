"""Overlap arithmetic on fixed inputs: shapes, roofline T_compute, ring all-reduce T_comm, depth, utilisation."""

from __future__ import annotations

import pytest

from gpudash.advisor.overlap import LayerShape, analyse, comm_time_s, compute_time_s


def test_layer_shape_counts() -> None:
    s = LayerShape(hidden=4096, ffn=14336, tokens=1, tp=2)
    assert s.params == 4 * 4096**2 + 3 * 4096 * 14336 == 243_269_632
    assert s.weight_bytes == 243_269_632  # fp16, halved by tp=2
    assert s.flops == 243_269_632  # 2 * 1 token * params / 2
    assert s.allreduce_bytes == 8192
    assert s.matmuls() == ((1, 4096, 6144), (1, 2048, 4096), (1, 4096, 14336), (1, 7168, 4096))
    assert sum(m * k * n for m, k, n in s.matmuls()) == s.params // 2


def test_layer_shape_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="divide by tp"):
        LayerShape(4096, 14336, 1, tp=3)
    with pytest.raises(ValueError, match="tokens"):
        LayerShape(4096, 14336, 0)


def test_roofline_compute_time() -> None:
    decode = LayerShape(1000, 1000, tokens=1)  # 7e6 params, 14 MB of fp16
    assert compute_time_s(decode, mem_bw_gbps=1000, matmul_tflops=100) == pytest.approx(14e-6)  # memory-bound
    prefill = LayerShape(1000, 1000, tokens=4096)  # 2 * 4096 * 7e6 = 5.73e10 FLOPs
    assert compute_time_s(prefill, 1000, 100) == pytest.approx(5.7344e10 / 1e14)  # compute-bound


def test_comm_time_weights_and_ring_allreduce() -> None:
    one = LayerShape(1000, 1000, tokens=1)
    assert comm_time_s(one, link_gbps=14, latency_us=0) == pytest.approx(14e6 / 14e9)  # weights over PCIe
    tp4 = LayerShape(1000, 1000, tokens=1000, tp=4)  # 2 MB activations per all-reduce
    # two all-reduces, each 2*(4-1)/4 * 2 MB over 100 GB/s plus 6 latency steps of 1 us
    assert comm_time_s(tp4, link_gbps=100, latency_us=1) == pytest.approx(2 * (6e-6 + 1.5 * 2e6 / 100e9))


def test_analyse_hides_and_depth() -> None:
    hidden = analyse(t_compute_s=1.0, t_comm_s=0.4, weight_bytes=800, mem_bw_gbps=1e-6)
    assert hidden.hides and hidden.depth == 1
    assert hidden.t_serial_s == 1.4 and hidden.t_overlapped_s == 1.0
    assert hidden.bw_util_serial == pytest.approx(800 / (1.4 * 1000)) and hidden.bw_util_overlapped == pytest.approx(0.8)
    exposed = analyse(t_compute_s=1.0, t_comm_s=2.5, weight_bytes=1000, mem_bw_gbps=1e-6)
    assert not exposed.hides and exposed.depth == 3 and exposed.t_overlapped_s == 2.5
    equal = analyse(1.0, 1.0, 1000, 1e-6)
    assert not equal.hides and equal.depth == 2  # strictly less is needed to hide it


def test_deferring_one_layer_on_the_mixed_rig() -> None:
    # tp=2 decode over the sim 5080 (960 GB/s, 56.3 TFLOPS), all-reduce staged through host PCIe 4.0 x8
    s = LayerShape(4096, 14336, tokens=1, tp=2)
    tc = compute_time_s(s, 960, 56.3)
    tm = comm_time_s(s, 13.7 / 2, 2.0)
    r = analyse(tc, tm, s.weight_bytes, 960)
    assert tc == pytest.approx(243_269_632 / 960e9)
    assert r.hides and r.depth == 1 and r.bw_util_overlapped == pytest.approx(1.0)
