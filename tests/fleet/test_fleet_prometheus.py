"""A real Prometheus scraping a real fleet (tests/fleet/conftest.py): the exposition as Prometheus stores it,
the shipped rules evaluating, every dashboard query answering, and `gpudash fleet` reading it all back.

The last test stops one box, so it stays last in this file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpudash.fleet import dashboard

from fleet_helpers import REPO, RULES, FleetRig, binary, stop, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))
from cli_helpers import run  # noqa: E402
from fixtures import FixedFeed, sim_snapshot  # noqa: E402
from tui_helpers import wait_for as tui_wait  # noqa: E402


def fleet_json(rig: FleetRig, *extra: str) -> dict:
    proc = run(rig.tmp, "fleet", "--prometheus", rig.prom.url, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_box_is_up_and_its_gpus_can_be_told_apart(fleet_rig: FleetRig) -> None:
    q = fleet_rig.prom.query
    info = {r["metric"]["instance"]: r["metric"] for r in q("gpudash_box_info")}
    gpudash_boxes = {i: w for i, w in fleet_rig.boxes.items() if w not in ("nothing", "prometheus")}
    assert set(info) == set(gpudash_boxes)
    for inst, what in gpudash_boxes.items():
        assert info[inst]["rig"] == ("sim:h200" if what == "vllm" else what)
        assert info[inst]["driver"] == "none" and info[inst]["version"] and info[inst]["hostname"]
    gpus = {(r["metric"]["instance"], r["metric"]["gpu"]) for r in q("gpudash_gpu_utilization_ratio")}
    assert len(gpus) == 1 + 8 + 2 + 1
    uuids = {r["metric"]["uuid"] for r in q("gpudash_gpu_utilization_ratio")}
    assert len(uuids) >= 8 + 2 + 1  # the two h200 boxes are the same simulated card
    assert all(0 <= float(r["value"][1]) <= 1 for r in q("gpudash_gpu_utilization_ratio"))


def test_the_vllm_box_exports_its_server_with_ttft_buckets_and_hits(fleet_rig: FleetRig) -> None:
    q = fleet_rig.prom.query
    (state,) = q('gpudash_server_state{state="ready"} == 1')
    assert state["metric"]["server"] == "chat" and state["metric"]["kind"] == "vllm"
    assert q("gpudash_server_up == 1")
    buckets = q("gpudash_server_request_ttft_seconds_bucket")
    assert {r["metric"]["le"] for r in buckets} >= {"0.1", "+Inf"}
    assert float(q("sum(gpudash_server_prefix_cache_queries_total)")[0]["value"][1]) > 0


def test_every_shipped_rule_evaluates_cleanly_on_the_real_series(fleet_rig: FleetRig) -> None:
    def evaluated() -> list[dict]:
        doc = httpx.get(f"{fleet_rig.prom.url}/api/v1/rules", timeout=10, trust_env=False).json()
        rules = [r for g in doc["data"]["groups"] for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else []

    rules = wait_for(evaluated, 30, "every rule evaluated once")
    assert len(rules) == 23 + 1  # the shipped ones and tests/fleet/alerts_now.yml's
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    hit = fleet_rig.prom.query("instance_server:gpudash_server_prefix_cache_hit:ratio_rate5m")
    assert len(hit) == 1 and 0 <= float(hit[0]["value"][1]) <= 1


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([promtool, "test", "rules", str(REPO / "tests" / "fleet" / "rules_test.yml")],
                           capture_output=True, text=True, timeout=120)
    assert tests.returncode == 0 and "SUCCESS" in tests.stdout, tests.stdout + tests.stderr


def test_every_dashboard_query_evaluates_against_the_real_prometheus(fleet_rig: FleetRig) -> None:
    doc = json.loads((REPO / "deploy" / "grafana" / "gpudash.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", ())]
    assert exprs == dashboard.panel_queries() and len(exprs) >= 20
    empty = []
    for expr in exprs:
        answer = httpx.get(f"{fleet_rig.prom.url}/api/v1/query", params={"query": expr.replace("$instance", ".*")},
                           timeout=10, trust_env=False).json()
        assert answer["status"] == "success", (expr, answer)
        if not answer["data"]["result"]:
            empty.append(expr)
    # What this fleet has none of: no server down, no store cap configured, no engine copies on record boxes.
    assert all(("gpudash_server_up" in e and "== 0" in e) or "store" in e or "engine_path" in e for e in empty), empty


def test_fleet_lists_every_target_with_its_figures(fleet_rig: FleetRig) -> None:
    doc = fleet_json(fleet_rig)
    boxes = {b["instance"]: b for b in doc["boxes"]}
    assert set(boxes) == set(fleet_rig.boxes)
    for inst, what in fleet_rig.boxes.items():
        b = boxes[inst]
        if what == "nothing":
            assert b["status"] == "down" and b["last_seen"] is None
        elif what == "prometheus":
            assert b["status"] == "no gpudash" and b["gpus"] is None
        else:
            assert b["status"] == "up", b
            assert b["gpus"] == {"sim:h200": 1, "sim:8xh20": 8, "sim:rtx5080+rtx3090": 2, "vllm": 1}[what]
            assert 0 <= b["util"] <= 1 and 0 < b["mem_used"] < b["mem_total"]
            assert b["tx_bps"] >= 0 and b["rx_bps"] >= 0 and b["link_bps"] > 0
    # besides servers found running on the same machine (another user's, found by their command lines)
    (chat,) = [s for s in boxes[next(i for i, w in fleet_rig.boxes.items() if w == "vllm")]["servers"]
               if s["state"] != "found"]
    assert chat["server"] == "chat" and chat["kind"] == "vllm" and chat["state"] == "ready"
    assert 0 < chat["ttft_p90_s"] < 5 and 0 <= chat["hit_rate"] <= 1
    firing = {i: b["alerts"] for i, b in boxes.items() if b["alerts"]}
    assert firing == {next(i for i, w in fleet_rig.boxes.items() if w == "vllm"): ["GpudashTestServerHasKvCache"]}
    table = run(fleet_rig.tmp, "fleet", "--prometheus", fleet_rig.prom.url)
    assert table.returncode == 0, table.stderr
    for word in ("no gpudash", "down", "sim:8xh20", " (1 ready)", "TTFT p90", "GpudashTestServerHasKvCache"):
        assert word in table.stdout
    (server_line,) = [ln for ln in table.stdout.splitlines() if " chat " in ln]
    assert server_line.split()[1:4] == ["chat", "vllm", "ready"]
    only = fleet_json(fleet_rig, "--job", "prometheus")
    assert [b["status"] for b in only["boxes"]] == ["no gpudash"]


@pytest.mark.anyio
async def test_the_fleet_tab_lists_sorts_filters_and_opens_a_box(fleet_rig: FleetRig) -> None:
    from textual.widgets import Static

    from gpudash.config import Config
    from gpudash.tui.app import GpudashApp
    from gpudash.tui.widgets.fleet import BoxScreen, FleetView
    from gpudash.tui.widgets.lines import TextLines

    class Feed(FixedFeed):
        config = Config.model_validate({"fleet": {"prometheus": fleet_rig.prom.url}})

    app = GpudashApp(Feed([sim_snapshot(tick=1)]))
    async with app.run_test(size=(160, 48)) as pilot:
        await tui_wait(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("0")
        view = app.query_one("#fleet-view", FleetView)

        def cells(label: str) -> list[str]:
            return [r[label] for r in view.rows]

        def title() -> str:
            return str(view.query_one(".view-title", Static).content)

        await tui_wait(pilot, lambda: len(view.rows) == len(fleet_rig.boxes), timeout=20, what="every box")
        lines = [line.plain for line in view.query_one("#fleet-lines", TextLines).lines]
        assert lines[0].split()[:4] == ["box", "host", "rig", "state"] and len(lines) == 1 + len(fleet_rig.boxes)
        assert all(len(line) <= 160 for line in lines)
        assert "6 of 6 boxes" in title() and "by state" in title()
        states = cells("state")
        assert states[0] == "down" and "no gpudash" in states and states.count("up") == 4  # needing a look first
        await pilot.press("o")  # by alerts: the box with the firing alert first
        await pilot.pause(0.1)
        vllm = next(i for i, w in fleet_rig.boxes.items() if w == "vllm")
        assert "by alerts" in title() and cells("box")[0] == vllm
        await pilot.press("slash", *"8xh20", "enter")
        await tui_wait(pilot, lambda: len(view.rows) == 1, what="the filter")
        assert cells("rig") == ["sim:8xh20"] and "1 of 6" in title()
        await pilot.press("enter")
        await tui_wait(pilot, lambda: isinstance(app.screen, BoxScreen), what="the box screen")
        box = app.screen
        await tui_wait(pilot, lambda: len(box.series.get("util", {})) == 8, timeout=20, what="8 GPUs' last hour")
        assert all(points for points in box.series["pcie rx"].values())  # 30 s steps over a rig a minute old
        head = str(box.query_one("#box-title", Static).content)
        assert "sim:8xh20" in head and "driver none" in head
        await pilot.press("escape")
        await tui_wait(pilot, lambda: not isinstance(app.screen, BoxScreen), what="back to the fleet")
        assert app.active_view == "fleet"


def test_a_box_that_stops_is_down_with_its_last_seen_time(fleet_rig: FleetRig) -> None:
    inst = next(i for i, w in fleet_rig.boxes.items() if w == "sim:h200")
    port = int(inst.rsplit(":", 1)[1])
    victim = next(p for p in fleet_rig.procs if f"127.0.0.1:{port}" in p.args)
    stopped = time.time()
    stop(victim)

    def down() -> dict | None:
        box = next(b for b in fleet_json(fleet_rig)["boxes"] if b["instance"] == inst)
        return box if box["status"] == "down" else None

    box = wait_for(down, 30, "the stopped box to be down")
    assert stopped - 5 < box["last_seen"] <= stopped + 1
    assert box["rig"] == "sim:h200" and box["gpus"] is None  # its identity stays, its live figures go
    table = run(fleet_rig.tmp, "fleet", "--prometheus", fleet_rig.prom.url)
    assert "down, last seen" in table.stdout
