"""The -ts planner: 2:3 for 16 GB + 24 GB when memory binds, one GPU, the impossible case, time balance."""

from __future__ import annotations

import pytest

from gpudash.advisor.planner import GB, GpuBudget, PlanError, plan_split, ts_argument
from gpudash.advisor.rates import budgets, sim_rates
from gpudash.telemetry.rig import read_topology

GiB = 2**30


def rig(profile: str) -> list[GpuBudget]:
    topo = read_topology(f"sim:{profile}")
    return budgets(topo, sim_rates(topo))


def test_16_plus_24_gb_memory_balance_lands_on_2_to_3() -> None:
    plan = plan_split(rig("rtx5080+rtx3090"), model_bytes=int(28.7 * GB), kv_bytes=4 * GB, balance="memory")
    assert plan.ts == "2,3"
    assert plan.ratios[0] == pytest.approx(0.4, abs=0.01) and sum(plan.ratios) == pytest.approx(1.0)
    assert plan.shares[0].fill == pytest.approx(plan.shares[1].fill)
    assert "same" in plan.reason and "free memory" in plan.reason


def test_time_balance_converges_to_memory_when_memory_binds() -> None:
    gpus = rig("rtx5080+rtx3090")
    small = plan_split(gpus, model_bytes=8 * GB, balance="time")
    # 960 GB/s vs 936 GB/s: nearly even when everything fits
    assert small.ratios[0] == pytest.approx(0.511, abs=0.005) and small.capped == ()
    full = plan_split(gpus, model_bytes=40 * GB, balance="time")
    assert full.capped == (0,) and full.shares[0].fill == pytest.approx(1.0, abs=1e-6)
    assert full.ratios[0] == pytest.approx(0.4, abs=0.02) and "memory binds on GPU 0" in full.reason
    # the time-balanced plan has the smaller worst per-token time (each token waits for the slowest GPU)
    mem = plan_split(gpus, model_bytes=8 * GB, balance="memory")
    assert max(s.token_time_s for s in small.shares) < max(s.token_time_s for s in mem.shares)


def test_one_gpu_takes_everything() -> None:
    plan = plan_split(rig("h200"), model_bytes=70 * GB, kv_bytes=10 * GB)
    assert plan.ts == "1" and plan.ratios == (1.0,)
    assert plan.shares[0].assigned_bytes == 80 * GB and "no -ts split is needed" in plan.reason


def test_model_larger_than_all_memory_is_one_clear_sentence() -> None:
    with pytest.raises(PlanError) as err:
        plan_split(rig("rtx5080+rtx3090"), model_bytes=45 * GB, kv_bytes=2 * GB)
    msg = str(err.value)
    assert ". " not in msg and "\n" not in msg  # one sentence
    assert "47.0 GB" in msg and "41.9 GB free" in msg and "smaller quantisation" in msg


def test_time_balance_needs_rates() -> None:
    with pytest.raises(PlanError, match="--balance memory"):
        plan_split([GpuBudget(0, "a", 16 * GiB), GpuBudget(1, "b", 24 * GiB)], 10 * GB, balance="time")
    plan = plan_split([GpuBudget(0, "a", 16 * GiB), GpuBudget(1, "b", 24 * GiB)], 10 * GB)
    assert plan.ts == "2,3" and plan.shares[0].token_time_s is None


@pytest.mark.parametrize("ratios,ts", [((0.3974, 0.6026), "2,3"), ((0.5, 0.5), "1,1"),
                                       ((0.125,) * 8, "1,1,1,1,1,1,1,1"), ((0.7, 0.2, 0.1), "7,2,1"),
                                       ((0.511, 0.489), "13,12"), ((0.0, 1.0), "0,1"),
                                       ((0.0, 0.4, 0.6), "0,2,3")])
def test_ts_argument_is_the_shortest_close_integer_ratio(ratios, ts) -> None:
    assert ts_argument(ratios) == ts


def test_bad_inputs() -> None:
    with pytest.raises(PlanError):
        plan_split([], GB)
    with pytest.raises(PlanError):
        plan_split(rig("h200"), 0)


def test_budgets_from_a_ticks_samples_for_the_tui() -> None:
    from gpudash.advisor.rates import RatesUnavailable, budgets_from_samples
    from gpudash.records import GpuSample

    ticks = [GpuSample(0.0, 0, "u0", "NVIDIA GeForce RTX 5080", mem_used=6 * GiB, mem_total=16 * GiB),
             GpuSample(0.0, 1, "u1", "NVIDIA GeForce RTX 3090", mem_used=8 * GiB, mem_total=24 * GiB)]
    # the server being re-split holds 5 GiB + 7 GiB now: it gets them back for the new split
    gpus = budgets_from_samples(ticks, held={0: 5 * GiB, 1: 7 * GiB})
    assert [g.free_bytes for g in gpus] == [15 * GiB, 23 * GiB]
    assert plan_split(gpus, 20 * GB).ts == "2,3"
    with pytest.raises(RatesUnavailable):
        budgets_from_samples([GpuSample(0.0, 0, "u0", "x")])


def test_measured_rates_without_cupy_say_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from gpudash.advisor.rates import RatesUnavailable, measured_rates

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    monkeypatch.delitem(sys.modules, "gpudash.advisor.measure", raising=False)
    with pytest.raises(RatesUnavailable, match=r"CuPy is not installed .*pip install 'gpudash\[cuda\]'"):
        measured_rates(read_topology("sim:h200"))


def test_a_gpu_without_usable_memory_gets_no_share() -> None:
    gpus = [GpuBudget(0, "full", 256 * 2**20), GpuBudget(1, "a", 16 * GiB), GpuBudget(2, "b", 24 * GiB)]
    plan = plan_split(gpus, 10 * GB)
    assert plan.ts == "0,2,3" and plan.shares[0].assigned_bytes == 0
