"""The Grafana dashboard gpudash ships (deploy/grafana/gpudash.json), generated from the panels below.

The per-box and per-server expressions are gpudash/fleet/queries.py's, the ones `gpudash fleet` asks,
so the dashboard and the CLI show the same figures. Regenerate the file with
`python -m gpudash.fleet.dashboard deploy/grafana/gpudash.json`; a test fails when it differs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from gpudash.fleet import queries

SEL = 'instance=~"$instance"'  # the dashboard's box picker


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str  # PromQL with {sel} where the box picker's matcher goes
    legend: str
    unit: str
    kind: str = "timeseries"  # or "stat"
    description: str = ""


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Fleet", (
        Panel("Boxes exporting gpudash", "count(gpudash_box_info{sel})", "boxes", "none", "stat"),
        Panel("Targets down", "count(up{sel} == 0) or vector(0)", "down", "none", "stat"),
        Panel("GPUs", "count(gpudash_gpu_memory_total_bytes{sel})", "GPUs", "none", "stat"),
        Panel("Alerts firing", 'count(ALERTS{alertstate="firing"}) or vector(0)', "alerts", "none", "stat"),
        Panel("GPU utilisation by box (mean over its GPUs)", queries.BOX["util"], "{{instance}}", "percentunit"),
        Panel("GPU memory used by box", queries.BOX["mem_used"], "{{instance}}", "bytes"),
        Panel("PCIe TX by box (GPU to host)", queries.BOX["tx"], "{{instance}}", "Bps"),
        Panel("PCIe RX by box (host to GPU)", queries.BOX["rx"], "{{instance}}", "Bps"),
    )),
    ("GPUs", (
        Panel("Utilisation", queries.GPU_SERIES["util"], "{{instance}} GPU{{gpu}}", "percentunit"),
        Panel("Memory used", queries.GPU_SERIES["memory"], "{{instance}} GPU{{gpu}}", "bytes"),
        Panel("PCIe link use, TX and RX, of the current link",
              "max by (instance, gpu) (gpudash_gpu_pcie_tx_bytes_per_second{sel} "
              "/ gpudash_gpu_pcie_link_capacity_bytes_per_second{sel}) or max by (instance, gpu) "
              "(gpudash_gpu_pcie_rx_bytes_per_second{sel} / gpudash_gpu_pcie_link_capacity_bytes_per_second{sel})",
              "{{instance}} GPU{{gpu}}", "percentunit"),
        Panel("PCIe link generation (current / max)",
              "gpudash_gpu_pcie_link_generation{sel} / gpudash_gpu_pcie_link_generation_max{sel}",
              "{{instance}} GPU{{gpu}}", "percentunit", description="Below 100% under load: a downgraded link."),
        Panel("Power", "gpudash_gpu_power_watts{sel}", "{{instance}} GPU{{gpu}}", "watt"),
        Panel("Temperature", "gpudash_gpu_temperature_celsius{sel}", "{{instance}} GPU{{gpu}}", "celsius"),
        Panel("Xid, ECC and lost-GPU events (last hour)", "increase(gpudash_gpu_fault_events_total{sel}[1h])",
              "{{instance}} GPU{{gpu}} {{kind}}", "none"),
    )),
    ("Servers", (
        Panel("TTFT p90 (probe requests)", queries.SERVER["ttft_p90"], "{{instance}} {{server}}", "s"),
        Panel("TTFT mean (server's own)", queries.SERVER["ttft_mean"], "{{instance}} {{server}}", "s"),
        Panel("Prefix-cache hit rate", queries.SERVER["hit_rate"], "{{instance}} {{server}}", "percentunit"),
        Panel("KV cache in use", queries.SERVER["kv"], "{{instance}} {{server}}", "percentunit"),
        Panel("Generated tokens per second", queries.SERVER["tokens_per_s"], "{{instance}} {{server}}", "none"),
        Panel("Requests waiting", "gpudash_server_requests_waiting{sel}", "{{instance}} {{server}}", "none"),
        Panel("Servers not up", "gpudash_server_up{sel} == 0", "{{instance}} {{server}}", "none"),
    )),
    ("Engine and store", (
        Panel("Transfer engine throughput", "sum by (instance, direction) "
              "(rate(gpudash_engine_path_bytes_total{sel}[5m]))", "{{instance}} {{direction}}", "Bps"),
        Panel("Store size and cap", "gpudash_store_data_bytes{sel} or gpudash_store_max_bytes{sel}",
              "{{instance}} {{__name__}}", "bytes"),
        Panel("gpudash CPU (cores)", 'rate(process_cpu_seconds_total{sel}[5m]) and on(instance) gpudash_box_info',
              "{{instance}}", "none"),
    )),
)


def panel_queries() -> list[str]:
    """Every panel's expression as the dashboard sends it (with the box picker's matcher)."""
    return [queries.fill(p.expr, SEL) for _, panels in ROWS for p in panels]


def _panel(p: Panel, pid: int, x: int, y: int) -> dict:
    w, h = (6, 4) if p.kind == "stat" else (12, 8)
    out: dict = {
        "id": pid, "type": p.kind, "title": p.title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": h, "w": w, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "targets": [{"refId": "A", "expr": queries.fill(p.expr, SEL), "legendFormat": p.legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}],
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
    return {
        "title": "gpudash fleet", "uid": "gpudash-fleet", "editable": True, "schemaVersion": 39, "version": 1,
        "tags": ["gpudash", "gpu", "llm"], "timezone": "", "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "description": "Boxes running `gpudash record|serve --prometheus` (generated by gpudash/fleet/dashboard.py).",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "instance", "type": "query", "label": "box", "multi": True, "includeAll": True,
             "allValue": ".*", "refresh": 2, "sort": 1,
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "definition": "label_values(gpudash_box_info, instance)",
             "query": {"query": "label_values(gpudash_box_info, instance)", "refId": "instances"}},
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
