"""The advisor on a real GPU: CuPy rates, the planner from measured throughput, the overlap baseline
with the engine copying while CuPy computes, and doctor's link check under a CUDA engine load.
Run on the GPU machine: ``pytest tests/gpu/test_advisor_gpu.py -m gpu -s`` (prints the numbers)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from gpudash.advisor.overlap import LayerShape, compute_time_s
from gpudash.cli import main
from gpudash.gpu import nvml

pytestmark = pytest.mark.gpu


def cli(*args: str) -> dict:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    print(r.stdout if "--json" not in args else "", r.stderr)
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_driver_present() -> None:
    assert nvml.driver_available() is None


def test_cupy_rates_are_plausible() -> None:
    from gpudash.advisor import measure

    bw, tflops = measure.memory_bandwidth_gbps(0), measure.matmul_tflops(0)
    print(f"GPU 0: copy bandwidth {bw:.0f} GB/s, fp16 matmul {tflops:.0f} TFLOPS")
    # physical sanity, not a performance target: above PCIe, below any HBM3e/Hopper peak
    assert 100 < bw < 10_000 and 5 < tflops < 5_000


def test_layer_time_near_roofline() -> None:
    from gpudash.advisor import measure

    shape = LayerShape(4096, 14336, tokens=1, tp=1)
    t = measure.layer_time_s(0, shape)
    bound = compute_time_s(shape, measure.memory_bandwidth_gbps(0), measure.matmul_tflops(0))
    print(f"decode layer: measured {t * 1e3:.3f} ms, roofline {bound * 1e3:.3f} ms")
    assert math.isfinite(t) and t > 0.5 * bound  # nothing beats the roofline by 2x


def test_plan_balances_time_from_measured_rates() -> None:
    data = cli("plan", "--no-sim", "--model-gb", "10", "--balance", "time", "--json")
    assert data["source"] == "nvml" and data["sim"] is False
    assert math.isclose(sum(data["ratios"]), 1.0)
    assert all(s["token_time_s"] > 0 for s in data["shares"])  # measured rates reached the planner
    if len(data["ratios"]) > 1:
        assert "measured (CuPy fp16)" in data["reason"]


def test_bench_overlap_runs_the_overlap() -> None:
    data = cli("bench", "overlap", "--no-sim", "--tp", "1", "--json")
    assert data["sim"] is False
    for row in data["rows"]:
        o = row["result"]
        print(f"GPU {row['gpu']}: T_compute {o['t_compute_s'] * 1e3:.3f} ms, T_comm {o['t_comm_s'] * 1e3:.3f} ms "
              f"({row['comm']}, {row['comm_gbps']:.1f} GB/s), ideal {o['t_overlapped_s'] * 1e3:.3f} ms, "
              f"achieved {row['achieved_s'] * 1e3:.3f} ms, serial {o['t_serial_s'] * 1e3:.3f} ms")
        assert row["source"] == "measured (CuPy fp16)" and row["achieved_s"] is not None
        # both streams really ran: the overlapped wall time cannot undercut the slower of the two
        assert row["achieved_s"] > 0.8 * o["t_overlapped_s"]


def test_doctor_reads_links_under_a_cuda_engine_load() -> None:
    data = cli("doctor", "--no-sim", "--json")
    checks = {c["check"]: c for c in data["checks"]}
    link = checks["link_busy"]
    print("\n".join(link["evidence"]))
    assert link["status"] in ("pass", "warn", "fail"), link  # warn: a slot narrower or older than its card
    assert all("while copying, moving" in ln for ln in link["evidence"] if "its slot allows" not in ln)
    assert checks["rebar"]["status"] in ("pass", "warn")
