"""A real Prometheus scraping a mixed fleet (tests/fleet/conftest.py): gpudash boxes, dcgm-exporter, a real
llama-server and the vLLM double, each scraped itself. Each GPU and server figure `gpudash fleet --json`
prints equals the series it names as its source (and the stand-in's own values), no GPU figure is exported
twice from one box, the two exporters' series join on(UUID) both ways, the shipped rules evaluate cleanly,
every dashboard query answers, and the Fleet tab shows the same boxes.

The last test stops one box, so it stays last in this file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpudash.fleet import dashboard, queries
from gpudash.telemetry.dcgm import TWINS

from dcgm_standin import value as standin_value
from fleet_helpers import H100S, REPO, RULES, FleetRig, binary, sim_gpus, stop, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))
from cli_helpers import run  # noqa: E402
from fixtures import FixedFeed, sim_snapshot  # noqa: E402
from tui_helpers import wait_for as tui_wait  # noqa: E402

BOXES = {"127.0.0.2": ("up", ["gpudash"], 1), "127.0.0.3": ("up", ["dcgm-exporter", "gpudash"], 8),
         "127.0.0.4": ("up", ["gpudash", "llama.cpp"], 2), "127.0.0.5": ("up", ["dcgm-exporter", "vllm"], 2),
         "127.0.0.6": ("up", ["gpudash", "vllm"], 1),
         "127.0.0.7": ("down", [], 0)}  # never answered: nothing is known of it but its target


def fleet_json(rig: FleetRig, *extra: str) -> dict:
    proc = run(rig.tmp, "fleet", "--prometheus", rig.prom.url, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def at(rig: FleetRig, expr: str, ts: float) -> list[dict]:
    doc = httpx.post(f"{rig.prom.url}/api/v1/query", data={"query": expr, "time": f"{ts:.3f}"}, timeout=10,
                     trust_env=False).json()
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def one(rig: FleetRig, expr: str, ts: float) -> float:
    (row,) = at(rig, expr, ts)
    return float(row["value"][1])


def test_every_host_is_one_box_of_its_targets(fleet_rig: FleetRig) -> None:
    doc = fleet_json(fleet_rig)
    boxes = {b["box"]: b for b in doc["boxes"]}
    assert set(boxes) == set(BOXES)  # Prometheus' own target (job "prometheus") exports no fleet series
    for host, (status, exports, gpus) in BOXES.items():
        b = boxes[host]
        assert (b["status"], b["exports"], len(b["gpus"])) == (status, exports, gpus), b
        assert sorted(t["instance"] for t in b["targets"]) == sorted(i for i in fleet_rig.targets
                                                                       if i.startswith(host + ":"))
    assert boxes["127.0.0.7"]["last_seen"] is None and boxes["127.0.0.7"]["gpu_count"] is None
    assert all(b["gpu_count"] == (len(b["gpus"]) or None) for b in boxes.values())
    assert boxes["127.0.0.5"]["driver"] == "580.95.05" and boxes["127.0.0.5"]["rig"] is None  # from dcgm-exporter
    assert boxes["127.0.0.3"]["rig"] == "sim:8xh20" and boxes["127.0.0.3"]["hostname"]
    only = fleet_json(fleet_rig, "--job", "prometheus")  # asked for by name, a job of no fleet series is listed
    assert [b["status"] for b in only["boxes"]] == ["no GPU metrics"]


def test_each_gpu_figure_equals_the_series_it_names(fleet_rig: FleetRig) -> None:
    doc = fleet_json(fleet_rig)
    ts, checked = doc["ts"], 0
    scale = {src.families: src.scale for sources in queries.GPU_FIGURES.values() for src in sources}
    for b in doc["boxes"]:
        for g in b["gpus"]:
            assert set(g["sources"]) >= {"util", "mem_used", "mem_total", "power_w", "temp_c"}, (b["box"], g)
            for figure, source in g["sources"].items():
                names = source.split("+")
                total = sum(one(fleet_rig, f'max({name}{{instance=~"{b["box"]}:.*",UUID="{g["uuid"]}"}})', ts)
                            for name in names)
                factor = next(v for k, v in scale.items() if set(k) <= set(names))
                assert math.isclose(g[figure], total * factor, rel_tol=1e-9), (b["box"], g["uuid"], figure)
                checked += 1
    assert checked > 100
    # and what the stand-in serves, unit for unit: a figure read through Prometheus is the exporter's own
    h100 = {g["uuid"]: g for b in doc["boxes"] if b["box"] == "127.0.0.5" for g in b["gpus"]}
    for gpu in H100S:
        g = h100[gpu["uuid"]]
        assert math.isclose(g["util"], standin_value("DCGM_FI_DEV_GPU_UTIL", gpu["gpu"]) / 100)
        assert g["mem_used"] == standin_value("DCGM_FI_DEV_FB_USED", gpu["gpu"]) * 2**20
        assert g["mem_total"] == sum(standin_value(f"DCGM_FI_DEV_FB_{k}", gpu["gpu"])
                                     for k in ("USED", "FREE", "RESERVED")) * 2**20
        assert (g["power_w"], g["temp_c"]) == (standin_value("DCGM_FI_DEV_POWER_USAGE", gpu["gpu"]),
                                               standin_value("DCGM_FI_DEV_GPU_TEMP", gpu["gpu"]))
        assert g["tx_bps"] == standin_value("DCGM_FI_PROF_PCIE_TX_BYTES", gpu["gpu"])
        assert g["sources"]["tx_bps"] == "DCGM_FI_PROF_PCIE_TX_BYTES" and g["model"] == "NVIDIA H100 80GB HBM3"
    beside = {g["uuid"]: g for b in doc["boxes"] if b["box"] == "127.0.0.3" for g in b["gpus"]}
    assert set(beside) == {g["uuid"] for g in sim_gpus("8xh20")}
    for g in beside.values():  # dcgm-exporter's where it has the figure, gpudash's what only gpudash knows
        assert g["sources"]["util"] == "DCGM_FI_DEV_GPU_UTIL"
        assert math.isclose(g["util"], standin_value("DCGM_FI_DEV_GPU_UTIL", int(g["gpu"])) / 100)
        assert g["sources"]["tx_bps"] == "gpudash_gpu_pcie_tx_bytes_per_second" and g["link_bps"] > 0


def test_a_list_of_boxes_has_the_totals_of_their_gpus(fleet_rig: FleetRig) -> None:
    """The Fleet tab's list asks Prometheus for each box's totals (no row per GPU); they are the totals of
    the GPUs `gpudash fleet --json` puts together, read at the same instant."""
    from gpudash.fleet.boxes import read_fleet
    from gpudash.fleet.client import PrometheusClient

    client = PrometheusClient(fleet_rig.prom.url)
    now = time.time()
    detail = {b.box: b for b in read_fleet(client, now=now).boxes}
    listed = {b.box: b for b in read_fleet(client, now=now, detail=False).boxes}
    assert set(detail) == set(listed) == set(BOXES)
    for box, b in listed.items():
        assert b.gpus == () and b.gpu_count == detail[box].gpu_count, box
        for figure in ("util", "mem_used", "mem_total", "tx_bps", "rx_bps", "link_bps"):
            mine, theirs = getattr(b, figure), getattr(detail[box], figure)
            assert (mine is None and theirs is None) or math.isclose(mine, theirs, rel_tol=1e-9), (box, figure)
        assert [(s.server, s.state) for s in b.servers] == [(s.server, s.state) for s in detail[box].servers]


def test_no_gpu_figure_is_exported_twice_from_one_box(fleet_rig: FleetRig) -> None:
    q = fleet_rig.prom.query
    for host in BOXES:
        for family, fields in TWINS.items():
            ours = {r["metric"]["UUID"] for r in q(f'{family}{{instance=~"{host}:.*"}}')}
            theirs = set.intersection(*({r["metric"]["UUID"] for r in q(f'{name}{{instance=~"{host}:.*"}}')}
                                        for name in fields))
            assert ours & theirs == set(), (host, family)
    # beside the dcgm-exporter gpudash still serves what only it knows, for every GPU
    assert len(q('gpudash_gpu_pcie_link_generation_max{instance=~"127.0.0.3:.*"}')) == 8
    assert q('gpudash_gpu_utilization_ratio{instance=~"127.0.0.3:.*"}') == []
    assert len(q('gpudash_gpu_utilization_ratio{instance=~"127.0.0.2:.*"}')) == 1  # alone, it serves them all


def test_gpudash_and_dcgm_exporter_series_join_on_uuid_both_ways(fleet_rig: FleetRig) -> None:
    q = fleet_rig.prom.query
    gd, dc = 'gpudash_gpu_pcie_link_generation_max{instance=~"127.0.0.3:.*"}', 'DCGM_FI_DEV_GPU_UTIL'
    assert len(q(f"{dc} * on(UUID) group_left() {gd}")) == 8
    assert len(q(f"{gd} * on(UUID) group_left() {dc}")) == 8
    assert len(q(f"{gd} * on(UUID, gpu, modelName, pci_bus_id, device) group_left() {dc}")) == 0  # sim: no bus id
    assert len(q(f"{gd} * on(UUID, gpu, modelName, device, Hostname) group_left() {dc}")) == 8


def test_each_server_figure_equals_the_series_it_names(fleet_rig: FleetRig) -> None:
    doc = fleet_json(fleet_rig)
    ts = doc["ts"]
    # (a gpudash also lists servers found running on its machine, by their command lines: on this shared
    # machine, every box's gpudash finds the fleet's own llama-server and anyone else's; those are "found")
    servers = {(b["box"], s["server"]): s for b in doc["boxes"] for s in b["servers"] if s["state"] != "found"}
    assert set(servers) == {("127.0.0.4", "code"), ("127.0.0.5", "meta-llama/Llama-3.1-8B-Instruct"),
                            ("127.0.0.6", "chat")}
    code, chat = servers["127.0.0.4", "code"], servers["127.0.0.6", "chat"]
    plain = servers["127.0.0.5", "meta-llama/Llama-3.1-8B-Instruct"]
    # gpudash's attached server and the server's own target are one row: the state from gpudash, the
    # figures from the server itself where it has them
    assert (code["kind"], code["state"], code["origin"], code["instance"]) == (
        "llama.cpp", "ready", "attached", fleet_rig.instance("llama-server"))
    assert (chat["kind"], chat["state"], chat["origin"]) == ("vllm", "ready", "attached")
    assert chat["instance"] == [i for i, w in fleet_rig.targets.items() if w == "vllm" and "127.0.0.6" in i][0]
    assert (plain["kind"], plain["state"], plain["origin"]) == ("vllm", "ready", None)
    # chat's gpudash re-exports its KV and requests (servers = "all"): each figure is still shown once, vLLM's
    assert chat["sources"]["kv_usage"] == "vllm:kv_cache_usage_perc" and chat["sources"]["running"].startswith("vllm:")
    assert code["sources"]["kv_usage"] == "gpudash_server_kv_cache_usage_ratio"  # from /slots: only gpudash has it
    assert code["sources"]["running"] == "llamacpp:requests_processing"
    assert chat["sources"]["probe_ttft_p90_s"] == "gpudash_server_probe_ttft_seconds"
    assert 0 < chat["probe_ttft_p90_s"] < 5 and 0 < code["probe_ttft_p90_s"] < 30
    assert 0 <= chat["probe_hit_rate"] <= 1
    checked = 0
    for (box, name), s in servers.items():
        for figure, part in s["sources"].items():
            own = part.startswith(("vllm:", "llamacpp:"))  # the server's own series, else gpudash's
            expr = queries.fill(queries.SERVER_PARTS[part], f'instance=~"{box}:.*"')
            (row,) = [r for r in at(fleet_rig, expr, ts)
                      if (r["metric"].get("instance") == s["instance"] if own else r["metric"].get("server") == name)]
            assert math.isclose(s[figure], float(row["value"][1]), rel_tol=1e-9), (box, name, figure)
            checked += 1
    assert checked >= 12
    # the fullest data-parallel engine's KV, the sum of running requests: as vLLM's own series say
    inst = plain["instance"]
    assert plain["kv_usage"] == one(fleet_rig, f'max(vllm:kv_cache_usage_perc{{instance="{inst}"}})', ts)
    assert plain["running"] == one(fleet_rig, f'sum(vllm:num_requests_running{{instance="{inst}"}})', ts)


def test_server_series_carry_kind_and_never_the_rigs_sim_source(fleet_rig: FleetRig) -> None:
    q = fleet_rig.prom.query
    assert q('{__name__=~"gpudash_server_.+", source=~".+"}') == []
    assert q('{__name__=~"gpudash_server_.+", kind=""}') == []
    assert len(q('{__name__=~"gpudash_gpu_.+", source=~"sim:.+"}')) > 0
    # by default the servers' own figures are not exported again: llama-server's requests only from it
    assert q('gpudash_server_requests_running{server="code"}') == []
    assert len(q('gpudash_server_kv_cache_usage_ratio{server="code"}')) == 1  # what only gpudash reads (/slots)
    # under servers = "all" they are, the TTFT as the histogram vLLM counts, never as quantiles
    assert len(q('gpudash_server_requests_running{server="chat"}')) == 1
    assert {r["metric"]["le"] for r in q('gpudash_server_ttft_seconds_bucket{server="chat"}')} >= {"0.001", "+Inf"}
    assert q('{__name__=~"gpudash_server_.*(p50|p90|p99|mean).*"}') == []


def test_every_shipped_rule_evaluates_cleanly_on_the_real_series(fleet_rig: FleetRig) -> None:
    def evaluated() -> list[dict]:
        doc = httpx.get(f"{fleet_rig.prom.url}/api/v1/rules", timeout=10, trust_env=False).json()
        rules = [r for g in doc["data"]["groups"] for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else []

    rules = wait_for(evaluated, 30, "every rule evaluated once")
    shipped = sum(line.lstrip().startswith(("- record:", "- alert:")) for line in RULES.read_text().splitlines())
    assert len(rules) == shipped + 1  # and tests/fleet/alerts_now.yml's
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    fleet = {r["metric"]["instance"]: r["value"][1] for r in fleet_rig.prom.query("gpudash:fleet_target:up")}
    assert set(fleet) == set(fleet_rig.targets)  # every fleet target, whatever its job, and Prometheus' own not
    assert fleet[fleet_rig.instance("nothing")] == "0"


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    example = REPO / "deploy" / "prometheus" / "prometheus.yml"  # the README's example scrape config
    check = subprocess.run([promtool, "check", "config", str(example)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "9400" in example.read_text(), check.stdout + check.stderr
    tests = subprocess.run([promtool, "test", "rules", str(REPO / "tests" / "fleet" / "rules_test.yml")],
                           capture_output=True, text=True, timeout=120)
    assert tests.returncode == 0 and "SUCCESS" in tests.stdout, tests.stdout + tests.stderr


def test_every_dashboard_query_evaluates_against_the_real_prometheus(fleet_rig: FleetRig) -> None:
    doc = json.loads((REPO / "deploy" / "grafana" / "gpudash.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", ())]
    assert exprs == dashboard.panel_queries() and len(exprs) >= 20
    jobs = "dcgm-exporter|gpudash|llama-server|vllm"
    empty = []
    for expr in exprs + dashboard.annotation_queries():  # as Grafana sends it: every job listed, all of the rest
        sent = expr.replace("$job", jobs).replace("$instance", ".*").replace("$__rate_interval", "1m")
        sent = sent.replace("$server", ".*").replace("$model", ".*")
        answer = httpx.post(f"{fleet_rig.prom.url}/api/v1/query", data={"query": sent}, timeout=10,
                            trust_env=False).json()
        assert answer["status"] == "success", (expr, answer)
        if not answer["data"]["result"]:
            empty.append(expr)
    # What this fleet has none of: no server down, no store cap, no engine copies on these boxes, no Xid,
    # no probe TTFT p90 of vLLM's own (the double's histogram is empty while only the probe asks), no J/token
    # of gpudash's (its servers here are attached, on no GPU it sees: tests/energy reads one that is).
    # Annotations mark changes: none in a fleet this young.
    assert all(("gpudash_server_up" in e and "== 0" in e) or "store" in e or "engine_path" in e
               or "XID" in e or e.startswith("changes(") or "gpudash_server_energy_joules" in e for e in empty), empty
    picker = doc["templating"]["list"][1]["query"]["query"]  # the job picker
    listed = httpx.get(f"{fleet_rig.prom.url}/api/v1/series",
                       params={"match[]": picker.removeprefix("label_values(").removesuffix(", job)")},
                       timeout=10, trust_env=False).json()["data"]
    assert {s["job"] for s in listed} == set(jobs.split("|"))  # the job picker: the fleet's jobs, not Prometheus'


def test_fleet_prints_every_box_and_server(fleet_rig: FleetRig) -> None:
    table = run(fleet_rig.tmp, "fleet", "--prometheus", fleet_rig.prom.url)
    assert table.returncode == 0, table.stderr
    for word in ("down", "sim:8xh20", "dcgm+gpudash", "dcgm+vllm", "TTFT p90", "GpudashTestServerHasKvCache",
                 "s probe", "meta-llama/Llama-3.1-8B-Instruct"):
        assert word in table.stdout, word
    (line,) = [ln for ln in table.stdout.splitlines() if " chat " in ln]
    assert line.split()[1:4] == ["chat", "vllm", "ready"]


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

        await tui_wait(pilot, lambda: len(view.rows) == len(BOXES), timeout=20, what="every box")
        lines = [line.plain for line in view.query_one("#fleet-lines", TextLines).lines]
        assert lines[0].split()[:4] == ["box", "host", "rig", "state"] and len(lines) == 1 + len(BOXES)
        assert all(len(line) <= 160 for line in lines)
        assert f"{len(BOXES)} of {len(BOXES)} boxes" in title() and "by state" in title()
        assert cells("state")[0].startswith("down") and cells("state").count("up") == 5  # needing a look first
        await pilot.press("o")  # by alerts: the box with the firing alert first
        await pilot.pause(0.1)
        assert "by alerts" in title() and cells("box")[0] == "127.0.0.4"  # alerts_now.yml: its llama-server
        await pilot.press("slash", *"8xh20", "enter")
        await tui_wait(pilot, lambda: len(view.rows) == 1, what="the filter")
        assert cells("rig") == ["sim:8xh20"] and f"1 of {len(BOXES)}" in title()
        await pilot.press("enter")
        await tui_wait(pilot, lambda: isinstance(app.screen, BoxScreen), what="the box screen")
        box = app.screen
        await tui_wait(pilot, lambda: len(box.series.get("util", {})) == 8, timeout=20, what="8 GPUs' last hour")
        assert all(points for points in box.series["pcie rx"].values())
        head = str(box.query_one("#box-title", Static).content)
        assert "sim:8xh20" in head and "dcgm+gpudash" in head
        await pilot.press("escape")
        await tui_wait(pilot, lambda: not isinstance(app.screen, BoxScreen), what="back to the fleet")
        assert app.active_view == "fleet"


def test_a_box_that_stops_is_down_with_its_last_seen_time(fleet_rig: FleetRig) -> None:
    inst = next(i for i in fleet_rig.targets if i.startswith("127.0.0.2:"))
    victim = next(p for p in fleet_rig.procs if inst in p.args)
    stopped = time.time()
    stop(victim)

    def down() -> dict | None:
        box = next(b for b in fleet_json(fleet_rig)["boxes"] if b["box"] == "127.0.0.2")
        return box if box["status"] == "down" else None

    box = wait_for(down, 30, "the stopped box to be down")
    assert stopped - 5 < box["last_seen"] <= stopped + 1
    assert box["rig"] == "sim:h200" and box["gpus"] == []  # its identity stays, its live figures go
    table = run(fleet_rig.tmp, "fleet", "--prometheus", fleet_rig.prom.url)
    assert "down, last seen" in table.stdout
