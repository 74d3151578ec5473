"""The PromQL that reads a fleet: one definition for `gpudash fleet`, the Fleet tab and the Grafana dashboard.

A fleet is what operators already run: dcgm-exporter on the GPU boxes, vLLM's and llama-server's own
/metrics, and gpudash where it runs. `gpudash fleet` asks for each source's raw series (PARTS, one
combined query) and puts the boxes together in gpudash/fleet/boxes.py: a box is a host, its targets the
scrape targets on it, and each GPU and server figure comes from the first source that has it (GPU_FIGURES,
SERVER_FIGURES), saying which. The dashboard draws the same families per target (DASHBOARD).

`{sel}` is where a caller's matchers go (a job regex, a box's instances), `{w}` the rate window ("5m" for
the CLI, "$__rate_interval" in Grafana). None of these need the shipped recording rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LOOKBACK = "1h"  # how far back a box that stopped answering is still listed, with its last-seen time
RATE_WINDOW = "5m"

# Series that make a scrape job part of the fleet: a target exporting any of them within LOOKBACK.
MEMBERS: dict[str, tuple[str, ...]] = {
    "gpudash": ("gpudash_box_info",),
    "dcgm-exporter": ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"),
    "vllm": ("vllm:num_requests_running",),
    "llama.cpp": ("llamacpp:requests_processing",),
}
FLEET_SERIES = "|".join(sorted(n for names in MEMBERS.values() for n in names))  # a regex over __name__


@dataclass(frozen=True)
class Source:
    """Where a GPU figure comes from: the sum of `families` (all present), plus `extra` where present, times
    `scale` to base units (bytes, watts, 0..1)."""

    families: tuple[str, ...]
    scale: float = 1.0
    extra: tuple[str, ...] = ()


# GPU figure -> its sources, preferred first. gpudash's PCIe rates are payload bytes, dcgm-exporter's
# include the protocol headers; a total of dcgm-exporter's framebuffer counts what the driver reserves.
GPU_FIGURES: dict[str, tuple[Source, ...]] = {
    "util": (Source(("DCGM_FI_DEV_GPU_UTIL",), 0.01), Source(("gpudash_gpu_utilization_ratio",))),
    "mem_used": (Source(("DCGM_FI_DEV_FB_USED",), 2.0**20), Source(("gpudash_gpu_memory_used_bytes",))),
    "mem_total": (Source(("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"), 2.0**20, ("DCGM_FI_DEV_FB_RESERVED",)),
                  Source(("gpudash_gpu_memory_total_bytes",))),
    "power_w": (Source(("DCGM_FI_DEV_POWER_USAGE",)), Source(("gpudash_gpu_power_watts",))),
    "temp_c": (Source(("DCGM_FI_DEV_GPU_TEMP",)), Source(("gpudash_gpu_temperature_celsius",))),
    "xid": (Source(("DCGM_FI_DEV_XID_ERRORS",)), Source(("gpudash_gpu_last_xid",))),
    "tx_bps": (Source(("gpudash_gpu_pcie_tx_bytes_per_second",)), Source(("DCGM_FI_PROF_PCIE_TX_BYTES",))),
    "rx_bps": (Source(("gpudash_gpu_pcie_rx_bytes_per_second",)), Source(("DCGM_FI_PROF_PCIE_RX_BYTES",))),
    "link_bps": (Source(("gpudash_gpu_pcie_link_capacity_bytes_per_second",)),),
}
GPU_FAMILIES = sorted({n for sources in GPU_FIGURES.values() for src in sources for n in src.families + src.extra})
GPU_BY = "instance, UUID, uuid, gpu, modelName"  # dcgm-exporter's -u spells UUID `uuid`

# Server figure -> the parts that carry it, preferred first (see SERVER_PARTS): the server's own series
# first (every request it served), then what gpudash re-exports or derives, then its probe's.
SERVER_FIGURES: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "gpudash_server_kv_cache_usage_ratio"),
    "hit_rate": ("vllm:prefix_cache_hits", "llamacpp:prompt_tokens_cached", "gpudash_server_prefix_cache_hits"),
    "probe_hit_rate": ("gpudash_server_probe_prompt_tokens_cached",),
    "ttft_p90_s": ("vllm:time_to_first_token_seconds",),
    "probe_ttft_p90_s": ("gpudash_server_probe_ttft_seconds",),
    "tokens_per_s": ("gpudash_server_generation_tokens_per_second", "vllm:generation_tokens",
                     "llamacpp:tokens_predicted"),
    "running": ("vllm:num_requests_running", "llamacpp:requests_processing", "gpudash_server_requests_running"),
    "waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "gpudash_server_requests_waiting"),
}


def vllm_p90(histogram: str) -> str:
    """The 90th percentile of one of vLLM's own histograms per server, over the rate window."""
    return f"histogram_quantile(0.9, sum by (instance, model_name, le) (rate({histogram}_bucket{{sel}}[{{w}}])))"


def _rate_ratio(by: str, hits: str, queries: str) -> str:
    return (f"sum by ({by}) (rate({hits}{{sel}}[{{w}}])) / sum by ({by}) (rate({queries}{{sel}}[{{w}}]))")


# Per server: part name -> PromQL. A gpudash server is (instance, server); a server scraped itself is its
# target (instance), with vLLM's model_name.
SERVER_PARTS = {
    "gpudash_server_kv_cache_usage_ratio": "max by (instance, server) (gpudash_server_kv_cache_usage_ratio{sel})",
    "gpudash_server_prefix_cache_hits": _rate_ratio("instance, server", "gpudash_server_prefix_cache_hits_total",
                                                    "gpudash_server_prefix_cache_queries_total"),
    "gpudash_server_probe_prompt_tokens_cached": _rate_ratio(
        "instance, server", "gpudash_server_probe_prompt_tokens_cached_total",
        "gpudash_server_probe_prompt_tokens_total"),
    "gpudash_server_probe_ttft_seconds": ("histogram_quantile(0.9, sum by (instance, server, le) "
                                          "(rate(gpudash_server_probe_ttft_seconds_bucket{sel}[{w}])))"),
    "gpudash_server_generation_tokens_per_second": ("max by (instance, server) "
                                                    "(gpudash_server_generation_tokens_per_second{sel})"),
    "gpudash_server_requests_running": "max by (instance, server) (gpudash_server_requests_running{sel})",
    "gpudash_server_requests_waiting": "max by (instance, server) (gpudash_server_requests_waiting{sel})",
    # vLLM: one series per data-parallel engine; KV is the fullest engine's (the one an alert is about)
    "vllm:kv_cache_usage_perc": ("max by (instance, model_name) "
                                 "(vllm:kv_cache_usage_perc{sel} or vllm:gpu_cache_usage_perc{sel})"),
    "vllm:prefix_cache_hits": ("sum by (instance, model_name) (rate(vllm:prefix_cache_hits_total{sel}[{w}]) or "
                               "rate(vllm:gpu_prefix_cache_hits_total{sel}[{w}])) / sum by (instance, model_name) "
                               "(rate(vllm:prefix_cache_queries_total{sel}[{w}]) or "
                               "rate(vllm:gpu_prefix_cache_queries_total{sel}[{w}]))"),
    "vllm:time_to_first_token_seconds": vllm_p90("vllm:time_to_first_token_seconds"),
    "vllm:generation_tokens": "sum by (instance, model_name) (rate(vllm:generation_tokens_total{sel}[{w}]))",
    "vllm:num_requests_running": "sum by (instance, model_name) (vllm:num_requests_running{sel})",
    "vllm:num_requests_waiting": "sum by (instance, model_name) (vllm:num_requests_waiting{sel})",
    "vllm:awake": 'min by (instance, model_name) (vllm:engine_sleep_state{sleep_state="awake",sel})',
    # llama-server: prompt tokens are counted without the cached ones, which have their own counter
    "llamacpp:prompt_tokens_cached": ("sum by (instance) (rate(llamacpp:prompt_tokens_cached_total{sel}[{w}])) / "
                                      "(sum by (instance) (rate(llamacpp:prompt_tokens_total{sel}[{w}])) + "
                                      "sum by (instance) (rate(llamacpp:prompt_tokens_cached_total{sel}[{w}])))"),
    "llamacpp:tokens_predicted": "sum by (instance) (rate(llamacpp:tokens_predicted_total{sel}[{w}]))",
    "llamacpp:requests_processing": "max by (instance) (llamacpp:requests_processing{sel})",
    "llamacpp:requests_deferred": "max by (instance) (llamacpp:requests_deferred{sel})",
}

# Energy and tokens per target, for a box's joules per token (fleet/energy.py): each GPU's energy from
# gpudash's counter, else dcgm-exporter's (mJ) for the GPUs gpudash does not count; tokens from each counter
# there is. Rates, so joules per second (watts) and tokens per second over the rate window.
ENERGY_PARTS = {
    "energy.gpudash_gpu_energy_joules_total":
        "sum by (instance) (rate(gpudash_gpu_energy_joules_total{sel}[{w}]))",
    "energy.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
        ("sum by (instance) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{sel}[{w}]) unless on(UUID) "
         "gpudash_gpu_energy_joules_total{sel}) * 0.001"),
    "tokens.vllm:generation_tokens_total": "sum by (instance) (rate(vllm:generation_tokens_total{sel}[{w}]))",
    "tokens.llamacpp:tokens_predicted_total": "sum by (instance) (rate(llamacpp:tokens_predicted_total{sel}[{w}]))",
    "tokens.gpudash_server_generation_tokens_total":
        "sum by (instance) (rate(gpudash_server_generation_tokens_total{sel}[{w}]))",
}

# What every read asks: the targets, what each exports, the boxes' facts, server states, energy and tokens.
PARTS = {
    **ENERGY_PARTS,
    "up": "up{sel}",
    **{f"member.{what}": "group by (instance, job, model_name) ("
       + " or ".join(f"last_over_time({name}{{sel}}[{LOOKBACK}])" for name in names) + ")"
       for what, names in MEMBERS.items()},
    "info": f"last_over_time(gpudash_box_info{{sel}}[{LOOKBACK}])",
    "sampled": f"max by (instance) (last_over_time(gpudash_sample_timestamp_seconds{{sel}}[{LOOKBACK}]))",
    "dcgm.host": ("group by (instance, Hostname, hostname, DCGM_FI_DRIVER_VERSION) "
                  "(DCGM_FI_DEV_FB_USED{sel} or DCGM_FI_DEV_GPU_UTIL{sel})"),
    "server.state": "group by (instance, server, kind, state) (gpudash_server_state{sel} == 1)",
    "server.info": "group by (instance, server, kind, port, origin) (gpudash_server_info{sel})",
}
# The last time each target answered (5 s steps), asked for the targets that do not answer now.
SEEN = f"max by (instance, job) (max_over_time(timestamp(up{{sel}} == 1)[{LOOKBACK}:5s]))"
# Each GPU family raw, per GPU: what a box's GPUs are put together from (read_fleet with detail).
GPU_PARTS = {f"gpu.{name}": f"max by ({GPU_BY}) ({name}{{sel}})" for name in GPU_FAMILIES}


def _preferred(figure: str) -> str:
    """One series per GPU for `figure`, from its first source that has the GPU (`or on(UUID)`), in base units."""
    terms = []
    for src in GPU_FIGURES[figure]:
        names = [f"{n}{{sel}}" for n in src.families]
        names += [f"({extra}{{sel}} or {src.families[0]}{{sel}} * 0)" for extra in src.extra]
        term = names[0] if len(names) == 1 else "(" + " + ".join(names) + ")"
        terms.append(term if src.scale == 1 else f"{term} * {src.scale!r}")
    return " or on(UUID) ".join(terms)


# Per target: each GPU figure summed over its GPUs (and how many have a utilisation, for the mean), each GPU
# counted once whoever exports it: what a list of boxes shows, without a row per GPU (read_fleet without
# detail; the same preference as GPU_FIGURES, so the totals equal those of the GPUs put together).
TOTAL_PARTS = {
    "total.gpus": ("count by (instance) (group by (instance, UUID) (DCGM_FI_DEV_FB_USED{sel}) or on(UUID) "
                   "group by (instance, UUID) (gpudash_gpu_fault_events_total{sel}))"),
    "total.util_n": f"count by (instance) ({_preferred('util')})",
    **{f"total.{figure}": f"sum by (instance) ({_preferred(figure)})"
       for figure in ("util", "mem_used", "mem_total", "tx_bps", "rx_bps", "link_bps")},
}
ALERTS = 'ALERTS{alertstate="firing",sel}'

# Per GPU of one box, for the drill-down's range plots (`{sel}` holds the box's instances).
GPU_SERIES = {
    "util": "gpudash_gpu_utilization_ratio{sel} or DCGM_FI_DEV_GPU_UTIL{sel} / 100",
    "memory": "gpudash_gpu_memory_used_bytes{sel} or DCGM_FI_DEV_FB_USED{sel} * 1048576",
    "pcie tx": "gpudash_gpu_pcie_tx_bytes_per_second{sel} or DCGM_FI_PROF_PCIE_TX_BYTES{sel}",
    "pcie rx": "gpudash_gpu_pcie_rx_bytes_per_second{sel} or DCGM_FI_PROF_PCIE_RX_BYTES{sel}",
}

# Per target, over gpudash's and dcgm-exporter's series alike, for the dashboard's per-box panels.
DASHBOARD = {
    "gpus": "count by (instance) (gpudash_gpu_pcie_link_generation_max{sel} or DCGM_FI_DEV_FB_USED{sel})",
    "util": "avg by (instance) (gpudash_gpu_utilization_ratio{sel} or DCGM_FI_DEV_GPU_UTIL{sel} / 100)",
    "mem_used": "sum by (instance) (gpudash_gpu_memory_used_bytes{sel} or DCGM_FI_DEV_FB_USED{sel} * 1048576)",
    # PCIe wire bytes: gpudash's 64-bit counters, else what dcgm-exporter's default counters have: its DCP
    # rate (4.5.3-4.8.2, GPUs with profiling only) or its NVML counter in KB (the releases after).
    "tx": ("sum by (instance) (rate(gpudash_gpu_pcie_tx_bytes_total{sel}[{w}]) or DCGM_FI_PROF_PCIE_TX_BYTES{sel} "
           "or rate(DCGM_FI_DEV_PCIE_TX_THROUGHPUT{sel}[{w}]) * 1024)"),
    "rx": ("sum by (instance) (rate(gpudash_gpu_pcie_rx_bytes_total{sel}[{w}]) or DCGM_FI_PROF_PCIE_RX_BYTES{sel} "
           "or rate(DCGM_FI_DEV_PCIE_RX_THROUGHPUT{sel}[{w}]) * 1024)"),
    "power": "gpudash_gpu_power_watts{sel} or DCGM_FI_DEV_POWER_USAGE{sel}",
    "temp": "gpudash_gpu_temperature_celsius{sel} or DCGM_FI_DEV_GPU_TEMP{sel}",
    "kv": ("max by (instance, server) (gpudash_server_kv_cache_usage_ratio{sel}) or "
           'label_replace(max by (instance, model_name) (vllm:kv_cache_usage_perc{sel}), "server", "$1", '
           '"model_name", "(.*)")'),
    "probe_ttft_p90": SERVER_PARTS["gpudash_server_probe_ttft_seconds"],
    "hit_rate": (SERVER_PARTS["vllm:prefix_cache_hits"] + " or " + SERVER_PARTS["llamacpp:prompt_tokens_cached"]
                 + " or " + SERVER_PARTS["gpudash_server_prefix_cache_hits"]),
    # joules per generated token of each server gpudash counts (the recording rule's expression)
    "joules_per_token": ("sum by (instance, server) (rate(gpudash_server_energy_joules_total{sel}[{w}])) / "
                         "(sum by (instance, server) (rate(gpudash_server_generation_tokens_total{sel}[{w}])) > 0)"),
    "tokens_per_s": (SERVER_PARTS["gpudash_server_generation_tokens_per_second"] + " or "
                     + SERVER_PARTS["vllm:generation_tokens"] + " or " + SERVER_PARTS["llamacpp:tokens_predicted"]),
}

TAG = "gpudash_q"  # the label that tells the parts of a combined query apart


def combined(exprs: dict[str, str]) -> str:
    """One expression answering all of `exprs` (name -> PromQL): each part's series are tagged with
    TAG=name and the parts joined with `or`, so a fleet read is one request and one answer to parse."""
    return " or ".join(f'label_replace({e}, "{TAG}", "{_escape(name)}", "", "")' for name, e in exprs.items())


def fill(expr: str, matchers: str = "", window: str = RATE_WINDOW) -> str:
    """The expression with `matchers` (PromQL label matchers without braces, "" for none) in every selector
    (`{sel}`, or `,sel}` inside a selector that has matchers of its own) and `window` for `{w}`."""
    return expr.replace("{w}", window).replace(",sel}", "," + matchers + "}" if matchers else "}").replace(
        "{sel}", "{" + matchers + "}" if matchers else "")


def instances_matcher(instances: list[str]) -> str:
    """`instance=~"a|b"`: exactly these instances (each quoted as a regular expression)."""
    return "instance=~" + _quote("|".join(re.escape(i) for i in sorted(instances)) or "^$")


def job_matcher(jobs: str) -> str:
    """`job=~"..."`: the jobs a regular expression names (a plain name is the one job)."""
    return "job=~" + _quote(jobs)


def _quote(value: str) -> str:
    return '"' + _escape(value) + '"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
