"""deploy/grafana/gpudash.json is generated from gpudash/fleet/dashboard.py: regenerating it gives the same
bytes (so nobody hand-edits the JSON), and it is a dashboard Grafana can import (`__inputs`, `__requires`),
whose pickers and panels count only the fleet's jobs, every panel says what it shows, annotations come from
the counters of gpudash's events, and `__requires` names the Grafana release that introduced the
dashboard's schemaVersion. (Every query runs against a real Prometheus in test_fleet_prometheus.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpudash.fleet import dashboard

FILE = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpudash.json"


def test_the_shipped_dashboard_is_the_generated_one() -> None:
    assert FILE.read_text(encoding="utf-8") == dashboard.render(), (
        "deploy/grafana/gpudash.json differs from its definition: run "
        "`python -m gpudash.fleet.dashboard deploy/grafana/gpudash.json`")


def test_the_dashboard_is_importable_and_shares_the_fleet_queries() -> None:
    doc = json.loads(FILE.read_text(encoding="utf-8"))
    assert doc["uid"] == "gpudash-fleet"
    # Grafana's dashboard migrator: schemaVersion 36 came with 9.0, 37 with 9.1, 38 with 10.0, 39 with 10.3
    grafana = {36: "9.0.0", 37: "9.1.0", 38: "10.0.0", 39: "10.3.0"}[doc["schemaVersion"]]
    assert {r["id"]: r["version"] for r in doc["__requires"]}["grafana"] == grafana
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "job", "instance", "server", "model"]
    server, model = doc["templating"]["list"][3:]
    assert server["allValue"] == model["allValue"] == ".*"  # "All" also keeps the series without that label
    assert [i["name"] for i in doc["__inputs"]] == ["DS_PROMETHEUS"]
    assert {r["id"] for r in doc["__requires"]} == {"grafana", "prometheus", "stat", "timeseries"}
    assert {p["type"] for p in doc["panels"]} - {"row"} <= {r["id"] for r in doc["__requires"]}
    job, boxes = doc["templating"]["list"][1:3]
    assert "allValue" not in job and job["includeAll"]  # "All" is the jobs listed: the fleet's, not every job
    assert "$job" in boxes["query"]["query"]
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])  # ids are unique
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        (target,) = p["targets"]
        assert "{sel}" not in target["expr"] and target["datasource"]["uid"] == "${datasource}"
    assert [p["title"] for p in panels if not p.get("description")] == []
    exprs = [p["targets"][0]["expr"] for p in panels]
    assert not any("[5m]" in e for e in exprs)  # rates over Grafana's $__rate_interval
    assert sum("$__rate_interval" in e for e in exprs) >= 5
    assert all('job=~"$job"' in e or "ALERTS" in e for e in exprs)
    servers = [p["targets"][0]["expr"] for p in panels if p["gridPos"]["y"] > _row_y(doc, "Servers")
               and p["gridPos"]["y"] < _row_y(doc, "Engine and store")]
    assert servers and all('server=~"$server",model_name=~"$model"' in e for e in servers)
    # PCIe traffic from the counters, by rate() (the link's capacity stays a gauge)
    assert not {"gpudash_gpu_pcie_tx_bytes_per_second", "gpudash_gpu_pcie_rx_bytes_per_second"} & set(
        re.findall(r"gpudash_[a-z_]+", " ".join(exprs)))
    # Every GPU family the fleet reads from dcgm-exporter and from gpudash is drawn, and the servers' own
    used = " ".join(exprs)
    for family in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
                   "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_DEV_XID_ERRORS", "gpudash_gpu_utilization_ratio",
                   "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds", "llamacpp:prompt_tokens_cached",
                   "gpudash_server_probe_ttft_seconds", "vllm:e2e_request_latency_seconds", "vllm:prompt_tokens_total",
                   "vllm:num_requests_running", "vllm:num_requests_waiting", "gpudash_gpu_clock_event_active",
                   "gpudash_gpu_sm_clock_hertz", "gpudash_gpu_pcie_tx_bytes_total", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
                   "gpudash_gpu_pcie_replay_errors_total", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"):
        assert family in used, family


def _row_y(doc: dict, title: str) -> int:
    (row,) = [p for p in doc["panels"] if p["type"] == "row" and p["title"] == title]
    return row["gridPos"]["y"]


def test_annotations_mark_gpudash_events_from_the_counters_that_count_them() -> None:
    """gpudash serves no series of events; its re-launches, crash restarts and GPU faults are counters, so
    the annotations are their changes (and dcgm-exporter's last Xid)."""
    doc = json.loads(FILE.read_text(encoding="utf-8"))
    notes = doc["annotations"]["list"]
    exprs = [a["expr"] for a in notes]
    assert exprs == dashboard.annotation_queries()
    for counter in ("gpudash_server_relaunches_total", "gpudash_server_restarts_total",
                    "gpudash_gpu_fault_events_total", "DCGM_FI_DEV_XID_ERRORS"):
        assert any(f"changes({counter}{{" in e for e in exprs), counter
    assert all(a["datasource"]["uid"] == "${datasource}" and a["enable"] and 'job=~"$job"' in a["expr"]
               for a in notes)
