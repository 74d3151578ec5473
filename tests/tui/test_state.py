"""The arithmetic behind the views, without a terminal: link share and downgrade warnings, split balance,
and the core staying free of textual."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

from click.testing import CliRunner
from fixtures import SPECS, sim_snapshot

from gpudash.cli import main
from gpudash.config import ServerSpec
from gpudash.records import Event, GpuProcessSample, GpuSample
from gpudash.tui.state import ViewState, recommend_split, runs_plan, split_balance, split_servers

H20 = GpuSample(0.0, 0, "u", "NVIDIA H20", util_pct=2.0, pcie_tx_bps=0.0, pcie_rx_bps=0.0, link_gen=5,
                link_width=16, link_gen_max=5, link_width_max=16)


def test_split_balance_targets_against_held_memory() -> None:
    snap = sim_snapshot("8xh20", tick=0)
    assert [s.name for s in split_servers(SPECS.values(), len(snap.gpus))] == ["big"]
    cpu_demo = SPECS["small"].model_copy(update={"gpus": []})  # "all GPUs or CPU" is not a split by itself
    assert split_servers([cpu_demo], 8) == []
    ts_only = SPECS["small"].model_copy(update={"gpus": [], "tensor_split": [1.0, 3.0]})
    assert [r.gpu for r in split_balance(ts_only, snap)] == [0, 1]
    rows = split_balance(SPECS["big"], snap)  # -ts 2,3 on GPUs 0,1; processes hold 7 and 9 GiB
    assert [(r.gpu, round(r.target, 3), round(r.actual, 4)) for r in rows] == [(0, 0.4, 0.4375), (1, 0.6, 0.5625)]
    assert abs(rows[0].imbalance - 0.0375) < 1e-9
    empty = split_balance(SPECS["big"], replace(snap, gpu_processes=(GpuProcessSample(0.0, 0, 1, 5, "x", "other"),)))
    assert all(r.actual is None and r.imbalance is None for r in empty)


def test_core_and_commands_do_not_import_textual() -> None:
    code = ("import sys, gpudash.runtime.control, gpudash.runtime.feed, gpudash.tui.state, gpudash.commands.launch, "
            "gpudash.commands.replay; assert 'textual' not in sys.modules, 'textual imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_launch_refuses_unknown_key_ids(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keys]\nwarp = "w"\n')
    res = CliRunner().invoke(main, ["--config", str(cfg), "launch", "--sim", "h200", "--no-record"])
    assert res.exit_code == 2 and "unknown action id warp" in res.output and "Traceback" not in res.output


def test_launch_refuses_an_unusable_db_before_opening_the_screen(tmp_path) -> None:
    res = CliRunner().invoke(main, ["launch", "--sim", "h200", "--db", str(tmp_path)])
    assert res.exit_code == 2 and "is a directory" in res.output and "Traceback" not in res.output


def test_recommend_split_lands_on_2_3_for_16_and_24_gb() -> None:
    snap = sim_snapshot("rtx5080+rtx3090")
    empty = replace(snap, gpus=tuple(replace(g, mem_used=0) for g in snap.gpus), gpu_processes=())
    plan = recommend_split(SPECS["big"], empty, 8 * 10**9)
    assert plan.ts == "2,3" and "free memory" in plan.reason
    assert recommend_split(SPECS["big"], empty, None).startswith("no plan yet")  # no size, nothing held
    assert "needs 100.0 GB" in recommend_split(SPECS["big"], empty, 100 * 10**9)  # the planner's sentence


def test_low_free_at_start_warning_stays_until_that_server_starts_again() -> None:
    state = ViewState()
    state.specs = {"big": SPECS["big"].model_copy(update={"share": 0.97}),
                   "side": ServerSpec(name="side", model="/m.gguf", gpus=[2], share=0.2)}
    snap = sim_snapshot("8xh20", tick=0)
    start = Event(snap.ts, "supervisor", "server.start", "big", None, "starting")
    state.ingest(replace(snap, events=(start,)))  # 4 GiB of others on GPU 0: below 0.97
    assert [(w.kind, w.gpu) for w in state.warnings] == [("low_free_at_start", 0), ("low_free_at_start", 1)]
    state.ingest(sim_snapshot("8xh20", tick=2))  # no event this tick: the warning is still shown
    assert len(state.warnings) == 2
    state.specs["big"] = state.specs["big"].model_copy(update={"share": 0.5})
    state.ingest(replace(snap, events=(start,)))  # started again with room for its share: cleared
    assert state.warnings == ()


def test_live_feed_lists_its_pools_and_the_engines_each_once(tmp_path) -> None:
    from gpudash.config import Config
    from gpudash.runtime.session import Session

    class Engine:  # what the session reads of the engine here: its own pools by name
        def pools(self) -> dict[str, str]:
            return {"engine-host": "engine's staging pool", "sim-host": "engine's clashing name"}

    session = Session("sim:h200", Config(), tmp_path / "db")
    session.engine, session.pools = Engine(), {"sim-host": "gpudash's host pool"}
    assert session.all_pools() == {"sim-host": "gpudash's host pool", "engine-host": "engine's staging pool"}


def test_a_split_runs_the_plan_when_its_proportions_match() -> None:
    snap = sim_snapshot("rtx5080+rtx3090")
    empty = replace(snap, gpus=tuple(replace(g, mem_used=0) for g in snap.gpus), gpu_processes=())
    plan = recommend_split(SPECS["big"], empty, 8 * 10**9)  # 2,3
    assert runs_plan(SPECS["big"].model_copy(update={"tensor_split": [0.4, 0.6]}), plan)
    assert not runs_plan(SPECS["big"].model_copy(update={"tensor_split": [1, 1]}), plan)
    assert not runs_plan(SPECS["big"].model_copy(update={"tensor_split": None}), plan)


def _server_tick(t: int, state: str, tps: float | None):
    snap = sim_snapshot(tick=t)
    big = replace(snap.servers[0], ts=snap.ts, state=state, tokens_per_s=tps)
    return replace(snap, servers=(big,))


def test_tokens_per_s_is_a_window_mean_and_none_once_not_ready() -> None:
    from gpudash.tui.state import RATE_WINDOW_S

    st = ViewState()
    st.ingest_all(_server_tick(t, "ready", 1200.0 if t % 2 else 0.0) for t in range(4))
    assert st.tokens_per_s("big") == 600.0  # 0, 1200, 0, 1200: not whatever the last tick said
    st.ingest(_server_tick(4, "stopped", 885.4))  # a stale rate from a stopped server is not shown
    assert st.tokens_per_s("big") is None
    st.ingest(_server_tick(5, "relaunching", None))
    assert st.tokens_per_s("big") is None
    far = int(RATE_WINDOW_S) + 10
    st.ingest_all([_server_tick(6, "ready", 100.0), _server_tick(far, "ready", 300.0)])
    assert st.tokens_per_s("big") == 300.0  # the tick 6 sample left the window


def card_plain(*args, **kw) -> list[str]:
    """A GPU card's lines as plain text."""
    from gpudash.tui.widgets.overview import card_lines

    return [line.plain for line in card_lines(*args, **kw)]


def test_gpu_cards_keep_pcie_when_small_and_fill_when_tall() -> None:
    g = replace(H20, mem_used=12 * 2**30, mem_total=96 * 2**30, power_w=110.0, temp_c=45.0,
                pcie_tx_bps=12e9, pcie_rx_bps=3e9)
    small = card_plain(g, True, [0.1] * 30, [0.0] * 30, width=16, height=7)
    assert len(small) <= 7 and all(len(line) <= 16 for line in small[1:]), small
    assert small[1].startswith("TX  12.0G") and small[2].startswith("RX   3.0G")  # the headline stays
    idle = "\n".join(card_plain(replace(g, pcie_tx_bps=0.0), False, [0.0] * 26, [0.0] * 26, width=26, height=13))
    assert "▁" * 26 in idle  # an idle link still draws its baseline
    tall = card_plain(g, False, [0.5] * 40, [0.5] * 40, width=40, height=33, util_hist=[0.2] * 40,
                     mem_hist=[0.125] * 40)
    assert "util history" in tall and "mem history" in tall and 33 - 4 < len(tall) <= 33  # a lone GPU's card is full
    assert "SM — held down by —  ECC — remapped —" in tall  # no clocks/ECC reported: NA (as status says it), not 0


def test_a_driver_fault_marks_its_gpu_card_above_everything() -> None:
    snap = sim_snapshot("8xh20", tick=3)
    fault = Event(snap.ts, "driver", "gpu.xid", "GPU1", new=79, ok=False, reason="Xid 79: GPU has fallen off the bus")
    st = ViewState()
    st.ingest(replace(snap, events=(fault, Event(snap.ts, "keyboard", "engine.knobs", "engine", {}, {}))))
    assert st.faults == {1: fault}
    g = st.latest.gpus[1]
    for width, height in ((26, 13), (16, 7), (60, 40)):
        lines = card_plain(g, True, [0.1] * 30, [0.1] * 30, width=width, height=height, fault=fault)
        assert "Xid 79" in lines[1] and len(lines[1]) <= width and len(lines) <= height, (width, height, lines)
    assert not any("Xid" in line for line in card_plain(st.latest.gpus[0], True, width=26, height=13))
