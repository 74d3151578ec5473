"""deploy/grafana/gpudash.json is generated from gpudash/fleet/dashboard.py: regenerating it gives the same
bytes (so nobody hand-edits the JSON), and it is a dashboard Grafana can import (`__inputs`, `__requires`),
whose pickers and panels count only the fleet's jobs. (Every query runs against a real Prometheus in
test_fleet_prometheus.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from gpudash.fleet import dashboard

FILE = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpudash.json"


def test_the_shipped_dashboard_is_the_generated_one() -> None:
    assert FILE.read_text(encoding="utf-8") == dashboard.render(), (
        "deploy/grafana/gpudash.json differs from its definition: run "
        "`python -m gpudash.fleet.dashboard deploy/grafana/gpudash.json`")


def test_the_dashboard_is_importable_and_shares_the_fleet_queries() -> None:
    doc = json.loads(FILE.read_text(encoding="utf-8"))
    assert doc["uid"] == "gpudash-fleet" and doc["schemaVersion"] >= 36
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "job", "instance"]
    assert [i["name"] for i in doc["__inputs"]] == ["DS_PROMETHEUS"]
    assert {r["id"] for r in doc["__requires"]} == {"grafana", "prometheus", "stat", "timeseries"}
    assert {p["type"] for p in doc["panels"]} - {"row"} <= {r["id"] for r in doc["__requires"]}
    job, boxes = doc["templating"]["list"][1:]
    assert "allValue" not in job and job["includeAll"]  # "All" is the jobs listed: the fleet's, not every job
    assert "$job" in boxes["query"]["query"]
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])  # ids are unique
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        (target,) = p["targets"]
        assert "{sel}" not in target["expr"] and target["datasource"]["uid"] == "${datasource}"
    exprs = [p["targets"][0]["expr"] for p in panels]
    assert not any("[5m]" in e for e in exprs)  # rates over Grafana's $__rate_interval
    assert sum("$__rate_interval" in e for e in exprs) >= 5
    assert all('job=~"$job"' in e or "ALERTS" in e for e in exprs)
    # Every GPU family the fleet reads from dcgm-exporter and from gpudash is drawn, and the servers' own
    used = " ".join(exprs)
    for family in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
                   "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_DEV_XID_ERRORS", "gpudash_gpu_utilization_ratio",
                   "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds", "llamacpp:prompt_tokens_cached",
                   "gpudash_server_probe_ttft_seconds"):
        assert family in used, family
