"""The PromQL that reads a fleet of gpudash boxes: one definition for `gpudash fleet`, the Fleet tab and
the Grafana dashboard, so the three never disagree about what "util" or "hit rate" means.

A box is a scrape target (`instance`); `{sel}` is where a caller's matcher (e.g. `job="gpudash"`) goes.
None of these need the shipped recording rules: a Prometheus that only scrapes answers them.
"""

from __future__ import annotations

LOOKBACK = "1h"  # how far back a box that stopped answering is still listed, with its last-seen time
RATE_WINDOW = "5m"

# Per box (by instance): name -> expression.
BOX = {
    "up": "up{sel}",
    "info": f"last_over_time(gpudash_box_info{{sel}}[{LOOKBACK}])",
    "last_seen": f"max by (instance) (last_over_time(gpudash_sample_timestamp_seconds{{sel}}[{LOOKBACK}]))",
    "gpus": "count by (instance) (gpudash_gpu_memory_total_bytes{sel})",
    "util": "avg by (instance) (gpudash_gpu_utilization_ratio{sel})",
    "mem_used": "sum by (instance) (gpudash_gpu_memory_used_bytes{sel})",
    "mem_total": "sum by (instance) (gpudash_gpu_memory_total_bytes{sel})",
    "tx": "sum by (instance) (gpudash_gpu_pcie_tx_bytes_per_second{sel})",
    "rx": "sum by (instance) (gpudash_gpu_pcie_rx_bytes_per_second{sel})",
    "link": "sum by (instance) (gpudash_gpu_pcie_link_capacity_bytes_per_second{sel})",
}
# Per server (by instance, server): name -> expression.
SERVER = {
    "state": "gpudash_server_state{sel} == 1",
    "ttft_p90": ("histogram_quantile(0.9, sum by (instance, server, le) "
                 f"(rate(gpudash_server_request_ttft_seconds_bucket{{sel}}[{RATE_WINDOW}])))"),
    "ttft_mean": "max by (instance, server) (gpudash_server_ttft_mean_seconds{sel})",
    "hit_rate": (f"sum by (instance, server) (rate(gpudash_server_prefix_cache_hits_total{{sel}}[{RATE_WINDOW}])) / "
                 f"sum by (instance, server) (rate(gpudash_server_prefix_cache_queries_total{{sel}}[{RATE_WINDOW}]))"),
    "kv": "max by (instance, server) (gpudash_server_kv_cache_usage_ratio{sel})",
    "tokens_per_s": "max by (instance, server) (gpudash_server_generation_tokens_per_second{sel})",
}
ALERTS = 'ALERTS{alertstate="firing",sel}'

# Per GPU of one box, for the drill-down's range plots (`{sel}` holds the box's instance matcher).
GPU_SERIES = {
    "util": "gpudash_gpu_utilization_ratio{sel}",
    "memory": "gpudash_gpu_memory_used_bytes{sel}",
    "pcie tx": "gpudash_gpu_pcie_tx_bytes_per_second{sel}",
    "pcie rx": "gpudash_gpu_pcie_rx_bytes_per_second{sel}",
}


TAG = "gpudash_q"  # the label that tells the parts of a combined query apart


def combined(exprs: dict[str, str]) -> str:
    """One expression answering all of `exprs` (name -> PromQL): each part's series are tagged with
    TAG=name and the parts joined with `or`, so a fleet read is one request and one answer to parse."""
    return " or ".join(f'label_replace({e}, "{TAG}", "{name}", "", "")' for name, e in exprs.items())


def fill(expr: str, matchers: str = "") -> str:
    """The expression with `matchers` (PromQL label matchers without braces, "" for none) in every selector
    (`{sel}`, or `,sel}` inside a selector that has matchers of its own)."""
    return expr.replace(",sel}", "," + matchers + "}" if matchers else "}").replace(
        "{sel}", "{" + matchers + "}" if matchers else "")


def instance_matcher(instance: str) -> str:
    """`instance="..."` with the value quoted as PromQL wants it."""
    return "instance=" + _quote(instance)


def job_matcher(job: str) -> str:
    return "job=" + _quote(job)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
