"""Prometheus exposition: a sampler sink that serves the latest Snapshot's values over HTTP.

The sink only keeps a reference to the newest (immutable) Snapshot; a custom collector turns it into
metric families when Prometheus scrapes, so a tick costs nothing extra and a scrape never sees half a
tick. Every series carries a `source` label (`nvml` or `sim:<profile>`), so simulated values stay
labelled on a fleet dashboard. Binds 127.0.0.1 unless a host is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from gpudash.records import Snapshot

DEFAULT_HOST = "127.0.0.1"

# (record field, metric name, help) per record kind; a None value (NA) is left out, never exported as 0.
_GPU = (
    ("util_pct", "gpudash_gpu_utilization_percent", "GPU utilisation, percent."),
    ("mem_used", "gpudash_gpu_memory_used_bytes", "GPU memory in use."),
    ("mem_total", "gpudash_gpu_memory_total_bytes", "GPU memory in total."),
    ("power_w", "gpudash_gpu_power_watts", "GPU board power."),
    ("temp_c", "gpudash_gpu_temperature_celsius", "GPU temperature."),
    ("sm_clock_mhz", "gpudash_gpu_sm_clock_mhz", "SM clock."),
    ("pcie_tx_bps", "gpudash_gpu_pcie_tx_bytes_per_second", "PCIe payload sent by the GPU (to host)."),
    ("pcie_rx_bps", "gpudash_gpu_pcie_rx_bytes_per_second", "PCIe payload received by the GPU (from host)."),
    ("link_gen", "gpudash_gpu_pcie_link_generation", "Current PCIe link generation."),
    ("link_width", "gpudash_gpu_pcie_link_width", "Current PCIe link width (lanes)."),
    ("link_gen_max", "gpudash_gpu_pcie_link_generation_max", "Maximum PCIe link generation."),
    ("link_width_max", "gpudash_gpu_pcie_link_width_max", "Maximum PCIe link width (lanes)."),
    ("bar1_total", "gpudash_gpu_bar1_total_bytes", "BAR1 aperture size."),
    ("bar1_used", "gpudash_gpu_bar1_used_bytes", "BAR1 aperture in use."),
)
_HOST = (
    ("cpu_pct", "gpudash_host_cpu_percent", "Host CPU use, percent of all cores."),
    ("mem_used", "gpudash_host_memory_used_bytes", "Host memory in use."),
    ("mem_total", "gpudash_host_memory_total_bytes", "Host memory in total."),
    ("gpudash_cpu_pct", "gpudash_process_cpu_percent", "gpudash's own CPU use, percent of one core."),
    ("gpudash_rss", "gpudash_process_rss_bytes", "gpudash's own resident memory."),
)
_PATH = (
    ("gbps", "gpudash_engine_path_gbps", "Transfer engine path throughput, GB/s."),
    ("queue_depth", "gpudash_engine_path_queue_depth", "Chunks queued on the path."),
)
_PATH_COUNTERS = (
    ("bytes_total", "gpudash_engine_path_bytes", "Payload bytes the path moved."),
    ("chunks_total", "gpudash_engine_path_chunks", "Chunks the path moved."),
)
_POOL = (
    ("slab", "gpudash_pool_slab_bytes", "Pool slab size (every shard plus what is unassigned)."),
    ("unassigned", "gpudash_pool_unassigned_bytes", "Slab bytes no shard owns (room to add or grow shards)."),
)
_SHARD = (
    ("capacity", "gpudash_pool_shard_capacity_bytes", "Pool shard capacity."),
    ("used", "gpudash_pool_shard_used_bytes", "Pool shard bytes in use."),
    ("largest_free", "gpudash_pool_shard_largest_free_bytes", "Largest free block of the shard."),
    ("fragmentation", "gpudash_pool_shard_fragmentation_ratio", "1 - largest free block / free bytes."),
)
_SERVER = (
    ("tokens_per_s", "gpudash_server_tokens_per_second", "Generated tokens per second."),
    ("prompt_tokens_per_s", "gpudash_server_prompt_tokens_per_second",
     "Computed prompt tokens per second (prefix-cache hits left out, for llama.cpp and vLLM alike)."),
    ("requests_running", "gpudash_server_requests_running", "Requests being processed."),
    ("requests_waiting", "gpudash_server_requests_waiting", "Requests queued."),
    ("kv_cache_usage", "gpudash_server_kv_cache_usage_ratio", "KV cache in use, 0..1."),
    ("ttft_mean_s", "gpudash_server_ttft_mean_seconds", "Mean time to first token."),
    ("restarts", "gpudash_server_restarts", "Restarts since launch."),
)


def parse_listen(value: str) -> tuple[str, int]:
    """(host, port) from ``PORT``, ``HOST:PORT`` or ``[IPv6]:PORT``; ValueError in one sentence otherwise."""
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]") if sep else DEFAULT_HOST
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 1 <= number <= 65535 or (sep and not host):
        raise ValueError(f"--prometheus expects [HOST:]PORT with a port from 1 to 65535 (e.g. 9400 or "
                         f"0.0.0.0:9400), got {value!r}")
    return host, number


class _Families:
    """Metric families being filled for one scrape."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.families: dict[str, Metric] = {}

    def add(self, spec: tuple[tuple[str, str, str], ...], record: Any, labels: dict[str, str],
            counter: bool = False) -> None:
        kind = CounterMetricFamily if counter else GaugeMetricFamily
        names = [*labels, "source"]
        for attr, name, doc in spec:
            value = getattr(record, attr)
            if value is None:
                continue
            fam = self.families.get(name)
            if fam is None:
                fam = self.families[name] = kind(name, doc, labels=names)
            fam.add_metric([*labels.values(), self.source], float(value))


class PrometheusSink:
    """Sampler sink + collector; `close()` stops the HTTP server."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = 9400) -> None:
        self._latest: Snapshot | None = None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self.host, self.port = host, port
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)

    def __call__(self, snap: Snapshot) -> None:
        self._latest = snap

    def collect(self) -> Iterator[Metric]:
        snap = self._latest
        if snap is None:
            return
        f = _Families(snap.source)
        info = GaugeMetricFamily("gpudash_tick", "Sampler tick of the values served.", labels=["source"])
        info.add_metric([snap.source], snap.tick)
        ts = GaugeMetricFamily("gpudash_sample_timestamp_seconds", "When the values were sampled.",
                               labels=["source"])
        ts.add_metric([snap.source], snap.ts)
        for g in snap.gpus:
            f.add(_GPU, g, {"gpu": str(g.index), "uuid": g.uuid, "name": g.name})
        if snap.host is not None:
            f.add(_HOST, snap.host, {})
        for p in snap.engine_paths:
            labels = {"path": p.path, "gpu": str(p.gpu), "direction": p.direction, "server": p.server or ""}
            f.add(_PATH, p, labels)
            f.add(_PATH_COUNTERS, p, labels, counter=True)
        for pool in snap.pools:
            f.add(_POOL, pool, {"pool": pool.pool})
        for s in snap.pool_shards:
            f.add(_SHARD, s, {"pool": s.pool, "shard": s.shard})
        for s in snap.servers:
            f.add(_SERVER, s, {"server": s.server, "kind": s.kind, "state": s.state})
        yield info
        yield ts
        yield from f.families.values()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
