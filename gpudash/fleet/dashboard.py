"""The Grafana dashboard gpudash ships (deploy/grafana/gpudash.json), generated from the panels below.

It draws a mixed fleet as operators run it: dcgm-exporter's GPU series, vLLM's and llama-server's own,
and gpudash's where it runs, per scrape target (`instance`), with the expressions of
gpudash/fleet/queries.py that `gpudash fleet` reads. Its `job` picker lists the jobs that export any of
those series (never node-exporter's), so "Targets down" and "Alerts firing" count the fleet's own; the
`box` picker lists those jobs' targets. Rates use `$__rate_interval`, and `__inputs`/`__requires` let
Grafana's import ask for the Prometheus data source. Regenerate the file with
`python -m gpudash.fleet.dashboard deploy/grafana/gpudash.json`; a test fails when it differs, and the
fleet tests run every panel's query against a real Prometheus.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from gpudash.fleet import queries

SEL = 'job=~"$job",instance=~"$instance"'  # the dashboard's job and box pickers
WINDOW = "$__rate_interval"
# Panels read the `datasource` picker; on import its default is the data source chosen for __inputs'
# DS_PROMETHEUS, and a provisioned copy falls back to the default Prometheus.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRAFANA_MIN = "9.0.0"  # $__rate_interval, the timeseries panel and the JSON model used here


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str  # PromQL with {sel} where the pickers' matchers go and {w} for the rate window
    legend: str
    unit: str
    kind: str = "timeseries"  # or "stat"
    description: str = ""


FLEET = f'{{__name__=~"{queries.FLEET_SERIES}",sel}}'
ALERTS = 'ALERTS{alertstate="firing",instance=~"$instance"}'  # rules that aggregate drop `job`, never `instance`
ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Fleet", (
        Panel("Targets exporting GPU or server series", f"count(group by (instance) ({FLEET}))", "targets", "none",
              "stat"),
        Panel("Targets down", "count(up{sel} == 0) or vector(0)", "down", "none", "stat"),
        Panel("GPUs", "count(count by (UUID) (gpudash_gpu_pcie_link_generation_max{sel} or DCGM_FI_DEV_FB_USED{sel}))",
              "GPUs", "none", "stat", "Distinct GPU UUIDs, from gpudash or dcgm-exporter."),
        Panel("Alerts firing", f"count({ALERTS}) or vector(0)", "alerts", "none", "stat"),
        Panel("GPU utilisation by target (mean over its GPUs)", queries.DASHBOARD["util"], "{{instance}}",
              "percentunit"),
        Panel("GPU memory used by target", queries.DASHBOARD["mem_used"], "{{instance}}", "bytes"),
        Panel("PCIe TX by target (GPU to host)", queries.DASHBOARD["tx"], "{{instance}}", "Bps",
              description="gpudash: payload bytes; dcgm-exporter: with the protocol headers."),
        Panel("PCIe RX by target (host to GPU)", queries.DASHBOARD["rx"], "{{instance}}", "Bps",
              description="gpudash: payload bytes; dcgm-exporter: with the protocol headers."),
    )),
    ("GPUs", (
        Panel("Utilisation", queries.GPU_SERIES["util"], "{{instance}} GPU{{gpu}}", "percentunit"),
        Panel("Memory used", queries.GPU_SERIES["memory"], "{{instance}} GPU{{gpu}}", "bytes"),
        Panel("PCIe link use, TX and RX, of the current link",
              "max by (instance, gpu) (gpudash_gpu_pcie_tx_bytes_per_second{sel} "
              "/ gpudash_gpu_pcie_link_capacity_bytes_per_second{sel}) or max by (instance, gpu) "
              "(gpudash_gpu_pcie_rx_bytes_per_second{sel} / gpudash_gpu_pcie_link_capacity_bytes_per_second{sel})",
              "{{instance}} GPU{{gpu}}", "percentunit", description="gpudash only: what the link carries."),
        Panel("PCIe link generation (current / max)",
              "gpudash_gpu_pcie_link_generation{sel} / gpudash_gpu_pcie_link_generation_max{sel}",
              "{{instance}} GPU{{gpu}}", "percentunit", description="Below 100% under load: a downgraded link."),
        Panel("Power", queries.DASHBOARD["power"], "{{instance}} GPU{{gpu}}", "watt"),
        Panel("Temperature", queries.DASHBOARD["temp"], "{{instance}} GPU{{gpu}}", "celsius"),
        Panel("Xid, ECC and lost-GPU events (last hour)", "increase(gpudash_gpu_fault_events_total{sel}[1h])",
              "{{instance}} GPU{{gpu}} {{kind}}", "none"),
        Panel("Last Xid (dcgm-exporter)", "DCGM_FI_DEV_XID_ERRORS{sel} > 0", "{{instance}} GPU{{gpu}}", "none"),
    )),
    ("Servers", (
        Panel("TTFT p90 (every request, the server's own histogram)",
              queries.vllm_p90("vllm:time_to_first_token_seconds"),
              "{{instance}} {{model_name}}", "s"),
        Panel("TTFT p90 (gpudash's probe requests)", queries.DASHBOARD["probe_ttft_p90"], "{{instance}} {{server}}",
              "s"),
        Panel("Prefix-cache hit rate", queries.DASHBOARD["hit_rate"], "{{instance}} {{server}}{{model_name}}",
              "percentunit"),
        Panel("KV cache in use (fullest engine)", queries.DASHBOARD["kv"], "{{instance}} {{server}}", "percentunit"),
        Panel("Generated tokens per second", queries.DASHBOARD["tokens_per_s"],
              "{{instance}} {{server}}{{model_name}}", "none"),
        Panel("Joules per generated token (gpudash)", queries.DASHBOARD["joules_per_token"], "{{instance}} {{server}}",
              "joule", description="The energy of the GPUs each server runs on (its SM share of a shared one), busy "
              "and idle, over the tokens it generated meanwhile."),
        Panel("Requests waiting", queries.SERVER_PARTS["vllm:num_requests_waiting"] + " or "
              + queries.SERVER_PARTS["llamacpp:requests_deferred"] + " or "
              + queries.SERVER_PARTS["gpudash_server_requests_waiting"], "{{instance}} {{server}}{{model_name}}",
              "none"),
        Panel("Inter-token latency p90 (vLLM's own histogram)", queries.vllm_p90("vllm:inter_token_latency_seconds"),
              "{{instance}} {{model_name}}", "s"),
        Panel("Time queued p90 (vLLM's own histogram)", queries.vllm_p90("vllm:request_queue_time_seconds"),
              "{{instance}} {{model_name}}", "s"),
        Panel("Requests preempted per second (vLLM)",
              "sum by (instance, model_name) (rate(vllm:num_preemptions_total{sel}[{w}]))",
              "{{instance}} {{model_name}}", "reqps", description="Above 0 for long: the KV cache is too small."),
        Panel("Requests ended in an error or aborted per second (vLLM)",
              'sum by (instance, model_name, finished_reason) (rate(vllm:request_success_total{finished_reason=~'
              '"error|abort",sel}[{w}]))', "{{instance}} {{model_name}} {{finished_reason}}", "reqps"),
        Panel("Servers not up (gpudash)", "gpudash_server_up{sel} == 0", "{{instance}} {{server}}", "none"),
    )),
    ("Engine and store", (
        Panel("Transfer engine throughput", "sum by (instance, direction) "
              "(rate(gpudash_engine_path_bytes_total{sel}[{w}]))", "{{instance}} {{direction}}", "Bps"),
        Panel("Store size and cap", "gpudash_store_data_bytes{sel} or gpudash_store_max_bytes{sel}",
              "{{instance}} {{__name__}}", "bytes"),
        Panel("gpudash CPU (cores)", "rate(process_cpu_seconds_total{sel}[{w}]) and on(instance) gpudash_box_info",
              "{{instance}}", "none"),
    )),
)


def panel_queries() -> list[str]:
    """Every panel's expression as the dashboard sends it (with the pickers' matchers)."""
    return [queries.fill(p.expr, SEL, WINDOW) for _, panels in ROWS for p in panels]


def _panel(p: Panel, pid: int, x: int, y: int) -> dict:
    w, h = (6, 4) if p.kind == "stat" else (12, 8)
    out: dict = {
        "id": pid, "type": p.kind, "title": p.title, "datasource": DATASOURCE,
        "gridPos": {"h": h, "w": w, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "targets": [{"refId": "A", "expr": queries.fill(p.expr, SEL, WINDOW), "legendFormat": p.legend,
                     "datasource": DATASOURCE}],
    }
    if p.description:
        out["description"] = p.description
    return out


def build() -> dict:
    """The dashboard as Grafana's JSON model."""
    panels: list[dict] = []
    y = pid = 0
    for title, row in ROWS:
        pid += 1
        panels.append({"id": pid, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        x = line_h = 0
        for p in row:
            pid += 1
            panel = _panel(p, pid, x, y)
            w, h = panel["gridPos"]["w"], panel["gridPos"]["h"]
            if x + w > 24:  # the next line of panels starts below the tallest of this one
                x, y, line_h = 0, y + line_h, 0
                panel["gridPos"].update(x=x, y=y)
            panels.append(panel)
            x, line_h = x + w, max(line_h, h)
        y += line_h
    picker = {"type": "query", "multi": True, "includeAll": True, "refresh": 2, "sort": 1, "datasource": DATASOURCE}
    jobs = f'label_values({{__name__=~"{queries.FLEET_SERIES}"}}, job)'
    targets = 'label_values(up{job=~"$job"}, instance)'
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_MIN},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
        ],
        "title": "gpudash fleet", "uid": "gpudash-fleet", "editable": True, "schemaVersion": 39, "version": 1,
        "tags": ["gpudash", "gpu", "llm", "dcgm"], "timezone": "", "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "description": "GPU boxes as dcgm-exporter, vLLM, llama-server and gpudash export them "
                       "(generated by gpudash/fleet/dashboard.py).",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus",
             "current": {"selected": False, "text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"}},
            # No allValue: "All" is the jobs listed, those that export fleet series, not every job there is.
            {**picker, "name": "job", "label": "job", "definition": jobs, "query": {"query": jobs, "refId": "jobs"}},
            {**picker, "name": "instance", "label": "box", "definition": targets,
             "query": {"query": targets, "refId": "instances"}},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as out:
            out.write(render())
    else:
        sys.stdout.write(render())
