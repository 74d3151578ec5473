"""The Grafana dashboard gpudash ships (deploy/grafana/gpudash.json), generated from the panels below.

It draws a mixed fleet as operators run it: dcgm-exporter's GPU series, vLLM's and llama-server's own,
and gpudash's where it runs, per scrape target (`instance`), with the expressions of
gpudash/fleet/queries.py that `gpudash fleet` reads. Its `job` picker lists the jobs that export any of
those series (never node-exporter's), so "Targets down" and "Alerts firing" count the fleet's own; the
`box` picker lists those jobs' targets, and the `server` and `model` pickers narrow the server panels.
Annotations mark gpudash's re-launches, crash restarts and GPU faults. Rates use `$__rate_interval`, and
`__inputs`/`__requires` let Grafana's import ask for the Prometheus data source. Regenerate the file with
`python -m gpudash.fleet.dashboard deploy/grafana/gpudash.json`; a test fails when it differs, and the
fleet tests run every panel's query against a real Prometheus.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

from gpudash.fleet import queries

SEL = 'job=~"$job",instance=~"$instance"'  # the dashboard's job and box pickers
WINDOW = "$__rate_interval"
# Panels read the `datasource` picker; on import its default is the data source chosen for __inputs'
# DS_PROMETHEUS, and a provisioned copy falls back to the default Prometheus.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# schemaVersion 36 is Grafana 9.0's (datasource references as {type, uid}); nothing here needs a later one
# ($__rate_interval, timeseries and stat panels, Prometheus annotations), and a newer Grafana migrates it.
SCHEMA_VERSION, GRAFANA_MIN = 36, "9.0.0"


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str  # PromQL with {sel} where the pickers' matchers go and {w} for the rate window
    legend: str
    unit: str
    kind: str = "timeseries"  # or "stat"
    description: str = ""  # what the panel shows and where from; every panel has one (a test holds it)


FLEET = f'{{__name__=~"{queries.FLEET_SERIES}",sel}}'
ALERTS = 'ALERTS{alertstate="firing",instance=~"$instance"}'  # rules that aggregate drop `job`, never `instance`
# The server and model pickers narrow the server panels: gpudash's series name a server (`server`), vLLM's
# the model it serves (`model_name`); "All" is ".*", which also matches a series without that label.
SERVER_SEL = 'server=~"$server",model_name=~"$model",sel'
DCGM_DEFAULT = ("dcgm-exporter: its default counters' DCGM_FI_PROF_PCIE_*_BYTES (4.5.3-4.8.2, GPUs with profiling) "
                "or DCGM_FI_DEV_PCIE_*_THROUGHPUT (later releases).")


def _server(expr: str) -> str:
    """A server panel's expression with the server and model pickers beside the job and box ones."""
    return re.sub(r"([{,])sel}", lambda m: m.group(1) + SERVER_SEL + "}", expr)  # one pass: SERVER_SEL ends in sel


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Fleet", (
        Panel("Targets exporting GPU or server series", f"count(group by (instance) ({FLEET}))", "targets", "none",
              "stat", "Scrape targets of the chosen jobs that export gpudash, dcgm-exporter, vLLM or llama-server "
              "series."),
        Panel("Targets down", "count(up{sel} == 0) or vector(0)", "down", "none", "stat",
              "Targets Prometheus could not scrape at its last try (GpudashBoxDown pages after 2 minutes)."),
        Panel("GPUs", "count(count by (UUID) (gpudash_gpu_pcie_link_generation_max{sel} or DCGM_FI_DEV_FB_USED{sel}))",
              "GPUs", "none", "stat", "Distinct GPU UUIDs, from gpudash or dcgm-exporter."),
        Panel("Alerts firing", f"count({ALERTS}) or vector(0)", "alerts", "none", "stat",
              "Alerts of the shipped rules firing now on the chosen boxes (deploy/RUNBOOK.md says what each means)."),
        Panel("GPU utilisation by target (mean over its GPUs)", queries.DASHBOARD["util"], "{{instance}}",
              "percentunit", description="gpudash's utilisation, else dcgm-exporter's DCGM_FI_DEV_GPU_UTIL."),
        Panel("GPU memory used by target", queries.DASHBOARD["mem_used"], "{{instance}}", "bytes",
              description="gpudash's, else dcgm-exporter's DCGM_FI_DEV_FB_USED (MiB, shown in bytes)."),
        Panel("PCIe TX by target (GPU to host)", queries.DASHBOARD["tx"], "{{instance}}", "Bps",
              description="Wire bytes, packet overhead included: gpudash's counters; " + DCGM_DEFAULT),
        Panel("PCIe RX by target (host to GPU)", queries.DASHBOARD["rx"], "{{instance}}", "Bps",
              description="Wire bytes, packet overhead included: gpudash's counters; " + DCGM_DEFAULT),
    )),
    ("GPUs", (
        Panel("Utilisation", queries.GPU_SERIES["util"], "{{instance}} GPU{{gpu}}", "percentunit",
              description="Per GPU: gpudash's, else dcgm-exporter's."),
        Panel("Memory used", queries.GPU_SERIES["memory"], "{{instance}} GPU{{gpu}}", "bytes",
              description="Per GPU: gpudash's, else dcgm-exporter's."),
        Panel("PCIe link use, TX and RX, of the current link",
              "max by (instance, gpu) (rate(gpudash_gpu_pcie_tx_bytes_total{sel}[{w}]) "
              "/ gpudash_gpu_pcie_link_capacity_bytes_per_second{sel}) or max by (instance, gpu) "
              "(rate(gpudash_gpu_pcie_rx_bytes_total{sel}[{w}]) / gpudash_gpu_pcie_link_capacity_bytes_per_second{sel})",
              "{{instance}} GPU{{gpu}}", "percentunit",
              description="gpudash only: the busier direction's wire bytes against what the current link carries."),
        Panel("PCIe link generation (current / max)",
              "gpudash_gpu_pcie_link_generation{sel} / gpudash_gpu_pcie_link_generation_max{sel}",
              "{{instance}} GPU{{gpu}}", "percentunit", description="Below 100% under load: a downgraded link."),
        Panel("PCIe replays per second",
              "rate(gpudash_gpu_pcie_replay_errors_total{sel}[{w}]) or rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{sel}[{w}])",
              "{{instance}} GPU{{gpu}}", "none",
              description="Packets the link resent; a healthy link has none (GpudashGpuPcieReplaysRising)."),
        Panel("SM clock", "gpudash_gpu_sm_clock_hertz{sel} or DCGM_FI_DEV_SM_CLOCK{sel} * 1000000",
              "{{instance}} GPU{{gpu}}", "hertz", description="gpudash's, else dcgm-exporter's (MHz, shown in Hz)."),
        Panel("Clock-event (throttle) reasons active",
              "max by (instance, gpu, reason) (gpudash_gpu_clock_event_active{sel})",
              "{{instance}} GPU{{gpu}} {{reason}}", "none",
              description="1 while a reason holds the clocks down (gpudash). Thermal and hardware slowdowns held for "
                          "10 minutes alert (GpudashGpuClocksThrottled); sw_power_cap under load is normal."),
        Panel("Power", queries.DASHBOARD["power"], "{{instance}} GPU{{gpu}}", "watt",
              description="Board power: gpudash's, else dcgm-exporter's."),
        Panel("Temperature", queries.DASHBOARD["temp"], "{{instance}} GPU{{gpu}}", "celsius",
              description="GPU temperature: gpudash's, else dcgm-exporter's."),
        Panel("Xid, ECC and lost-GPU events (last hour)", "increase(gpudash_gpu_fault_events_total{sel}[1h])",
              "{{instance}} GPU{{gpu}} {{kind}}", "none",
              description="What the driver reported to gpudash; the alerts class Xids by NVIDIA's catalog."),
        Panel("Last Xid (dcgm-exporter)", "DCGM_FI_DEV_XID_ERRORS{sel} > 0", "{{instance}} GPU{{gpu}}", "none",
              description="dcgm-exporter's last Xid of each GPU (0, not shown, is none)."),
    )),
    ("Servers", (
        Panel("TTFT p90 (every request, the server's own histogram)",
              _server(queries.vllm_p90("vllm:time_to_first_token_seconds")),
              "{{instance}} {{model_name}}", "s", description="vLLM's time to first token, p90 over the window."),
        Panel("TTFT p90 (gpudash's probe requests)", _server(queries.DASHBOARD["probe_ttft_p90"]),
              "{{instance}} {{server}}", "s",
              description="The probe's own requests, so a server with no traffic of its own still has a figure."),
        Panel("Request latency p90, end to end (vLLM's own histogram)",
              _server(queries.vllm_p90("vllm:e2e_request_latency_seconds")), "{{instance}} {{model_name}}", "s",
              description="Queue, prefill and decode of every request (GpudashServerE2eLatencyAboveSlo)."),
        Panel("Inter-token latency p90 (vLLM's own histogram)",
              _server(queries.vllm_p90("vllm:inter_token_latency_seconds")), "{{instance}} {{model_name}}", "s",
              description="Time between two output tokens (GpudashServerItlAboveSlo)."),
        Panel("Time queued p90 (vLLM's own histogram)", _server(queries.vllm_p90("vllm:request_queue_time_seconds")),
              "{{instance}} {{model_name}}", "s", description="How long requests wait before they start."),
        Panel("Prompt tokens per second",
              _server("sum by (instance, server) (rate(gpudash_server_prompt_tokens_total{sel}[{w}])) or "
                      "sum by (instance, model_name) (rate(vllm:prompt_tokens_total{sel}[{w}])) or "
                      "sum by (instance) (rate(llamacpp:prompt_tokens_total{sel}[{w}]))"),
              "{{instance}} {{server}}{{model_name}}", "none",
              description="Prompt tokens computed (prefill): gpudash's counter, else the server's own."),
        Panel("Generated tokens per second", _server(queries.DASHBOARD["tokens_per_s"]),
              "{{instance}} {{server}}{{model_name}}", "none", description="Output tokens (decode)."),
        Panel("Joules per generated token (gpudash)", _server(queries.DASHBOARD["joules_per_token"]),
              "{{instance}} {{server}}", "joule", description="The energy of the GPUs each server runs on (its SM "
              "share of a shared one), busy and idle, over the tokens it generated meanwhile."),
        Panel("Requests running", _server(queries.SERVER_PARTS["vllm:num_requests_running"] + " or "
                                          + queries.SERVER_PARTS["llamacpp:requests_processing"] + " or "
                                          + queries.SERVER_PARTS["gpudash_server_requests_running"]),
              "{{instance}} {{server}}{{model_name}}", "none", description="Requests being processed now."),
        Panel("Requests waiting", _server(queries.SERVER_PARTS["vllm:num_requests_waiting"] + " or "
                                          + queries.SERVER_PARTS["llamacpp:requests_deferred"] + " or "
                                          + queries.SERVER_PARTS["gpudash_server_requests_waiting"]),
              "{{instance}} {{server}}{{model_name}}", "none",
              description="Requests queued (GpudashServerQueueBacklog above gpudash:requests_waiting_max)."),
        Panel("Prefix-cache hit rate", _server(queries.DASHBOARD["hit_rate"]), "{{instance}} {{server}}{{model_name}}",
              "percentunit", description="Prompt tokens found in the prefix cache, of those looked up."),
        Panel("KV cache in use (fullest engine)", _server(queries.DASHBOARD["kv"]), "{{instance}} {{server}}",
              "percentunit", description="Above 95% for 5 minutes alerts (GpudashKvCacheFull)."),
        Panel("Requests preempted per second (vLLM)",
              _server("sum by (instance, model_name) (rate(vllm:num_preemptions_total{sel}[{w}]))"),
              "{{instance}} {{model_name}}", "reqps",
              description="Above 0.1/s for 10 minutes alerts: the KV cache is too small (GpudashServerPreempting)."),
        Panel("Requests ended in an error or aborted per second (vLLM)",
              _server('sum by (instance, model_name, finished_reason) (rate(vllm:request_success_total{finished_reason=~'
                      '"error|abort",sel}[{w}]))'), "{{instance}} {{model_name}} {{finished_reason}}", "reqps",
              description="vLLM's requests that ended without an answer."),
        Panel("Servers not up (gpudash)", _server("gpudash_server_up{sel} == 0"), "{{instance}} {{server}}", "none",
              description="Servers gpudash knows that do not answer their health check."),
    )),
    ("Engine and store", (
        Panel("Transfer engine throughput", "sum by (instance, direction) "
              "(rate(gpudash_engine_path_bytes_total{sel}[{w}]))", "{{instance}} {{direction}}", "Bps",
              description="Payload gpudash's transfer engine moved, host to GPU and back."),
        Panel("Store size and cap", "gpudash_store_data_bytes{sel} or gpudash_store_max_bytes{sel}",
              "{{instance}} {{__name__}}", "bytes", description="gpudash's SQLite store against [store] max_bytes."),
        Panel("gpudash CPU (cores)", "rate(process_cpu_seconds_total{sel}[{w}]) and on(instance) gpudash_box_info",
              "{{instance}}", "none", description="CPU time gpudash itself takes, in cores."),
    )),
)
# Annotations: gpudash serves no event series, so its events reach the dashboard through the counters that
# count them: operator re-launches (a split or share change), crash restarts, and GPU faults; dcgm-exporter's
# last Xid where gpudash does not run. (A split change without a re-launch is in gpudash's store only.)
ANNOTATIONS = (
    ("Server re-launched (gpudash)", "changes(gpudash_server_relaunches_total{sel}[2m]) > 0", "#5794F2",
     "{{server}} re-launched on {{instance}}"),
    ("Server restarted after a crash (gpudash)", "changes(gpudash_server_restarts_total{sel}[2m]) > 0", "#FF9830",
     "{{server}} restarted on {{instance}}"),
    ("GPU fault (Xid, ECC, lost)", "changes(gpudash_gpu_fault_events_total{sel}[2m]) > 0 "
     "or changes(DCGM_FI_DEV_XID_ERRORS{sel}[2m]) > 0", "#F2495C", "GPU {{gpu}} on {{instance}}: {{kind}}"),
)


def panel_queries() -> list[str]:
    """Every panel's expression as the dashboard sends it (with the pickers' matchers)."""
    return [queries.fill(p.expr, SEL, WINDOW) for _, panels in ROWS for p in panels]


def annotation_queries() -> list[str]:
    return [queries.fill(expr, SEL, WINDOW) for _, expr, _, _ in ANNOTATIONS]


def _panel(p: Panel, pid: int, x: int, y: int) -> dict:
    w, h = (6, 4) if p.kind == "stat" else (12, 8)
    out: dict = {
        "id": pid, "type": p.kind, "title": p.title, "datasource": DATASOURCE,
        "gridPos": {"h": h, "w": w, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "targets": [{"refId": "A", "expr": queries.fill(p.expr, SEL, WINDOW), "legendFormat": p.legend,
                     "datasource": DATASOURCE}],
    }
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
    servers = 'label_values(gpudash_server_up{job=~"$job",instance=~"$instance"}, server)'
    models = 'label_values(vllm:num_requests_running{job=~"$job",instance=~"$instance"}, model_name)'
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_MIN},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
        ],
        "title": "gpudash fleet", "uid": "gpudash-fleet", "editable": True, "schemaVersion": SCHEMA_VERSION,
        "version": 1,
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
            {**picker, "name": "server", "label": "server", "definition": servers, "allValue": ".*",
             "query": {"query": servers, "refId": "servers"}},
            {**picker, "name": "model", "label": "model", "definition": models, "allValue": ".*",
             "query": {"query": models, "refId": "models"}},
        ]},
        "annotations": {"list": [
            {"name": name, "datasource": DATASOURCE, "enable": True, "iconColor": color, "expr": expr,
             "step": "1m", "titleFormat": name, "textFormat": text, "tagKeys": "instance,server,gpu",
             "useValueForTime": False}
            for (name, _, color, text), expr in zip(ANNOTATIONS, annotation_queries())]},
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
