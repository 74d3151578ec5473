"""Prometheus exposition: a sampler sink that serves the latest Snapshot's values over HTTP.

The sink keeps a reference to the newest (immutable) Snapshot plus a few counters that accumulate
events across ticks (GPU faults, probe TTFTs); a custom collector turns them into metric families when
Prometheus scrapes, so a scrape never sees half a tick. Names follow Prometheus' naming guide
(prometheus.io/docs/practices/naming): base units (`_bytes`, `_seconds`, `_ratio`, `_hertz`), `_total`
on counters, one `gpudash_box_info` per target with the facts that tell boxes apart (the scrape's
`instance` plus that info metric identify a box), and the client library's standard `process_*`
families for gpudash's own CPU and memory. GPU series carry `gpu` (index), `uuid` and `name` as
dcgm-exporter's do; server series carry `server` and `kind`. Every series also carries a `source`
label (`nvml` or `sim:<profile>`), so simulated values stay labelled on a fleet dashboard. Binds
127.0.0.1 unless a host is given.
"""

from __future__ import annotations

import importlib.metadata
import socket
import sqlite3
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import PROCESS_COLLECTOR, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from gpudash.launcher.probe.cache_kinds import GRACE_S, RESTORE_EVENT, classify
from gpudash.records import GPU_FAULT_KINDS, RequestSample, ServerState, Snapshot
from gpudash.telemetry.links import link_capacity_bps

DEFAULT_HOST = "127.0.0.1"

# (record field, metric name, help, scale) per record kind; a None value (NA) is left out, never 0.
_GPU = (
    ("util_pct", "gpudash_gpu_utilization_ratio", "GPU utilisation, 0..1.", 0.01),
    ("mem_used", "gpudash_gpu_memory_used_bytes", "GPU memory in use.", 1),
    ("mem_total", "gpudash_gpu_memory_total_bytes", "GPU memory in total.", 1),
    ("power_w", "gpudash_gpu_power_watts", "GPU board power.", 1),
    ("temp_c", "gpudash_gpu_temperature_celsius", "GPU temperature.", 1),
    ("sm_clock_mhz", "gpudash_gpu_sm_clock_hertz", "SM clock.", 1e6),
    ("pcie_tx_bps", "gpudash_gpu_pcie_tx_bytes_per_second", "PCIe payload sent by the GPU (to host).", 1),
    ("pcie_rx_bps", "gpudash_gpu_pcie_rx_bytes_per_second", "PCIe payload received by the GPU (from host).", 1),
    ("link_gen", "gpudash_gpu_pcie_link_generation", "Current PCIe link generation.", 1),
    ("link_width", "gpudash_gpu_pcie_link_width", "Current PCIe link width (lanes).", 1),
    ("link_gen_max", "gpudash_gpu_pcie_link_generation_max", "Maximum PCIe link generation.", 1),
    ("link_width_max", "gpudash_gpu_pcie_link_width_max", "Maximum PCIe link width (lanes).", 1),
    ("bar1_total", "gpudash_gpu_bar1_total_bytes", "BAR1 aperture size.", 1),
    ("bar1_used", "gpudash_gpu_bar1_used_bytes", "BAR1 aperture in use.", 1),
    ("remapped_rows", "gpudash_gpu_remapped_rows", "Rows remapped after uncorrectable errors.", 1),
)
_GPU_COUNTERS = (
    ("ecc_uncorrected", "gpudash_gpu_ecc_uncorrected_errors", "Volatile uncorrected ECC errors since boot.", 1),
)
_HOST = (
    ("cpu_pct", "gpudash_host_cpu_utilization_ratio", "Host CPU use, 0..1 of all cores.", 0.01),
    ("mem_used", "gpudash_host_memory_used_bytes", "Host memory in use.", 1),
    ("mem_total", "gpudash_host_memory_total_bytes", "Host memory in total.", 1),
)
_PATH = (
    ("queue_depth", "gpudash_engine_path_queue_depth", "Chunks queued on the path.", 1),
)
_PATH_COUNTERS = (
    ("bytes_total", "gpudash_engine_path_bytes", "Payload bytes the path moved.", 1),
    ("chunks_total", "gpudash_engine_path_chunks", "Chunks the path moved.", 1),
    ("cpu_s", "gpudash_engine_path_cpu_seconds", "CPU time the path's copies took.", 1),
)
_POOL = (
    ("slab", "gpudash_pool_slab_bytes", "Pool slab size (every shard plus what is unassigned).", 1),
    ("unassigned", "gpudash_pool_unassigned_bytes", "Slab bytes no shard owns (room to add or grow shards).", 1),
)
_SHARD = (
    ("capacity", "gpudash_pool_shard_capacity_bytes", "Pool shard capacity.", 1),
    ("used", "gpudash_pool_shard_used_bytes", "Pool shard bytes in use.", 1),
    ("largest_free", "gpudash_pool_shard_largest_free_bytes", "Largest free block of the shard.", 1),
    ("fragmentation", "gpudash_pool_shard_fragmentation_ratio", "1 - largest free block / free bytes.", 1),
)
_SHARD_COUNTERS = (
    ("failures", "gpudash_pool_shard_allocation_failures", "Allocations the shard refused.", 1),
)
_SERVER = (
    ("tokens_per_s", "gpudash_server_generation_tokens_per_second", "Generated tokens per second.", 1),
    ("prompt_tokens_per_s", "gpudash_server_prompt_tokens_per_second",
     "Computed prompt tokens per second (prefix-cache hits left out, for llama.cpp and vLLM alike).", 1),
    ("requests_running", "gpudash_server_requests_running", "Requests being processed.", 1),
    ("requests_waiting", "gpudash_server_requests_waiting", "Requests queued.", 1),
    ("kv_cache_usage", "gpudash_server_kv_cache_usage_ratio", "KV cache in use, 0..1.", 1),
    ("ttft_mean_s", "gpudash_server_ttft_mean_seconds",
     "Mean time to first token over the server's last scrape interval (its own metric).", 1),
    ("draft_acceptance", "gpudash_server_draft_acceptance_ratio", "Speculative draft tokens accepted, 0..1.", 1),
    ("ttft_p50_s", "gpudash_server_ttft_p50_seconds",
     "Median time to first token over the server's last scrape interval (its own histogram).", 1),
    ("ttft_p90_s", "gpudash_server_ttft_p90_seconds",
     "90th percentile time to first token over the server's last scrape interval (its own histogram).", 1),
    ("ttft_p99_s", "gpudash_server_ttft_p99_seconds",
     "99th percentile time to first token over the server's last scrape interval (its own histogram).", 1),
)
_SERVER_COUNTERS = (
    ("prefix_cache_queries", "gpudash_server_prefix_cache_queries",
     "Prompt tokens (vLLM 0.8: blocks) looked up in the prefix cache.", 1),
    ("prefix_cache_hits", "gpudash_server_prefix_cache_hits", "Prefix-cache lookups that hit.", 1),
    ("external_prefix_cache_queries", "gpudash_server_external_prefix_cache_queries",
     "Prompt tokens looked up in the host-memory KV cache after the GPU prefix cache missed (vLLM KV offload).", 1),
    ("external_prefix_cache_hits", "gpudash_server_external_prefix_cache_hits",
     "Host-memory KV cache lookups that hit (vLLM KV offload).", 1),
    ("restarts", "gpudash_server_restarts", "Restarts after a crash since launch.", 1),
    ("relaunches", "gpudash_server_relaunches", "Re-launches an operator asked for.", 1),
)
# Every state a live server can be in: each gets a series (1 for the current one, else 0), so a change of
# state never starts or ends a series and `gpudash_server_state{state="backoff"} == 1` is an alert expression.
SERVER_STATES = tuple(s for s in ServerState if s is not ServerState.UNKNOWN)
FAULT_KINDS = tuple(k.removeprefix("gpu.") for k in GPU_FAULT_KINDS)  # xid, ecc, lost
# TTFT buckets: from an in-slot hit on a small model (tens of ms) to a long prompt computed anew.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0)
PENDING_MAX = 10_000  # probe requests waiting for their restore line; a flood beyond it is counted now


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


def open_sink(listen: str, store: StoreSize | None = None) -> PrometheusSink:
    """A serving sink at `listen` ([HOST:]PORT); ValueError in one sentence for an address that is not
    one or a port that cannot be bound."""
    host, port = parse_listen(listen)
    try:
        return PrometheusSink(host, port, store=store)
    except OSError as err:
        raise ValueError(f"cannot serve Prometheus on {host}:{port} ({err.strerror}); pick another [HOST:]PORT "
                         "for --prometheus") from None


def box_facts(source: str) -> dict[str, str]:
    """The labels of gpudash_box_info: what tells one box from another beside the scrape's instance."""
    driver = cuda = "none"
    if source == "nvml":
        from gpudash.gpu import nvml

        driver, cuda = nvml.driver_version() or "unknown", nvml.cuda_driver_version() or "unknown"
    try:
        version = importlib.metadata.version("gpudash")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"hostname": socket.gethostname(), "driver": driver, "cuda": cuda, "rig": source, "version": version}


@dataclass(frozen=True, slots=True)
class StoreSize:
    """The SQLite file a recorder writes and its configured cap, read when Prometheus scrapes."""

    path: Path
    max_bytes: int | None

    def data_bytes(self) -> int | None:
        """Bytes of pages in use (what `[store] max_bytes` caps), or None when the file cannot be read."""
        try:
            # as a URI whose path is quoted: a `?` or `#` in the file name would start its query or fragment
            with sqlite3.connect(f"{Path(self.path).absolute().as_uri()}?mode=ro", uri=True, timeout=0.5) as db:
                pages = db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
                return pages * db.execute("PRAGMA page_size").fetchone()[0]
        except sqlite3.Error:
            return None


class _Families:
    """Metric families being filled for one scrape."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.families: dict[str, Metric] = {}

    def family(self, kind: type, name: str, doc: str, labels: list[str]) -> Any:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = kind(name, doc, labels=[*labels, "source"])
        return fam

    def value(self, kind: type, name: str, doc: str, labels: dict[str, str], value: float) -> None:
        self.family(kind, name, doc, list(labels)).add_metric([*labels.values(), self.source], float(value))

    def add(self, spec: tuple[tuple[str, str, str, float], ...], record: Any, labels: dict[str, str],
            counter: bool = False) -> None:
        kind = CounterMetricFamily if counter else GaugeMetricFamily
        for attr, name, doc, scale in spec:
            value = getattr(record, attr)
            if value is not None:
                self.value(kind, name, doc, labels, value * scale)


class _Histogram:
    """Cumulative TTFT buckets, sum and count for one (server, cache kind)."""

    __slots__ = ("buckets", "total", "count")

    def __init__(self) -> None:
        self.buckets = [0] * len(TTFT_BUCKETS)
        self.total = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        for i, le in enumerate(TTFT_BUCKETS):
            if v <= le:
                self.buckets[i] += 1
        self.total += v
        self.count += 1


class _Accumulated:
    """What builds up across ticks: GPU fault events per kind and probe TTFTs per server and cache kind.

    A probe request waits GRACE_S after its end for the log line that marks a host-cache restore, then
    cache_kinds.classify names it slot, restore or miss (unknown where its cache use is not reported)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: dict[tuple[str, str], int] = {}
        self.last_xid: dict[str, int] = {}
        self.ttft: dict[tuple[str, str], _Histogram] = {}
        self.probe_failed: dict[str, int] = {}  # failed probe requests per server, and the last one's error
        self.probe_error: dict[str, str] = {}
        self._pending: deque[RequestSample] = deque()
        self._restores: deque[Any] = deque(maxlen=1000)

    def add(self, snap: Snapshot) -> None:
        with self.lock:
            for g in snap.gpus:
                for kind in FAULT_KINDS:
                    self.faults.setdefault((str(g.index), kind), 0)
            for e in snap.events:
                if e.kind in GPU_FAULT_KINDS:
                    gpu = e.target.removeprefix("GPU")
                    key = (gpu, e.kind.removeprefix("gpu."))
                    self.faults[key] = self.faults.get(key, 0) + 1
                    if e.kind == "gpu.xid" and isinstance(e.new, int):
                        self.last_xid[gpu] = e.new
                elif e.kind == RESTORE_EVENT:
                    self._restores.append(e)
            self._pending.extend(r for r in snap.requests if r.ok and r.ttft_s is not None)
            for r in snap.requests:
                if not r.ok:
                    self.probe_failed[r.server] = self.probe_failed.get(r.server, 0) + 1
                    self.probe_error[r.server] = (r.error or "unknown")[:200]
            self._settle(snap.ts)

    def _settle(self, now: float) -> None:
        ready = []
        while self._pending and (len(self._pending) > PENDING_MAX or _ended(self._pending[0]) + GRACE_S <= now):
            ready.append(self._pending.popleft())
        if not ready:
            return
        for r, kind in zip(ready, classify(ready, self._restores)):
            key = (r.server, kind or "unknown")
            hist = self.ttft.get(key)
            if hist is None:
                hist = self.ttft[key] = _Histogram()
            hist.observe(float(r.ttft_s or 0.0))

    def families(self, f: _Families) -> None:
        with self.lock:
            for (gpu, kind), n in sorted(self.faults.items()):
                f.value(CounterMetricFamily, "gpudash_gpu_fault_events",
                        "Xid, double-bit ECC and GPU-lost events the driver reported.", {"gpu": gpu, "kind": kind}, n)
            for gpu, xid in sorted(self.last_xid.items()):
                f.value(GaugeMetricFamily, "gpudash_gpu_last_xid", "The last Xid code the GPU reported.",
                        {"gpu": gpu}, xid)
            for server, n in sorted(self.probe_failed.items()):
                f.value(CounterMetricFamily, "gpudash_server_probe_failed_requests",
                        "Probe requests that failed (they never count as missing TTFT).", {"server": server}, n)
                f.value(GaugeMetricFamily, "gpudash_server_probe_last_error_info",
                        "The last distinct error a failed probe request ended with.",
                        {"server": server, "error": self.probe_error[server]}, 1)
            if self.ttft:
                fam = f.family(HistogramMetricFamily, "gpudash_server_request_ttft_seconds",
                               "Time to first token of the requests gpudash measured (probe), by how the "
                               "prompt was served: slot (in-slot hit), restore (host cache), miss, unknown.",
                               ["server", "cache"])
                for (server, kind), h in sorted(self.ttft.items()):
                    buckets = [(repr(le), n) for le, n in zip(TTFT_BUCKETS, h.buckets)] + [("+Inf", h.count)]
                    fam.add_metric([server, kind, f.source], buckets, sum_value=h.total)


def _ended(r: RequestSample) -> float:
    return r.ts + (r.total_s or r.ttft_s or 0.0)


class PrometheusSink:
    """Sampler sink + collector; `close()` stops the HTTP server."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = 9400, store: StoreSize | None = None) -> None:
        self._latest: Snapshot | None = None
        self._facts: dict[str, str] | None = None
        self._acc = _Accumulated()
        self._store = store
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        registry.register(PROCESS_COLLECTOR)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        self.host, self.port = host, port
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)

    def __call__(self, snap: Snapshot) -> None:
        self._acc.add(snap)
        if self._facts is None or self._facts["rig"] != snap.source:
            self._facts = box_facts(snap.source)
        self._latest = snap

    def collect(self) -> Iterator[Metric]:
        snap, facts = self._latest, self._facts
        if snap is None or facts is None:
            return
        info = GaugeMetricFamily("gpudash_box_info", "The box: hostname, NVIDIA driver, CUDA, rig and gpudash "
                                 "version (value 1).", labels=list(facts))
        info.add_metric(list(facts.values()), 1)
        yield info
        f = _Families(snap.source)
        f.value(CounterMetricFamily, "gpudash_sampler_ticks", "Sampler ticks taken.", {}, snap.tick + 1)
        f.value(GaugeMetricFamily, "gpudash_sample_timestamp_seconds", "When the values served were sampled.",
                {}, snap.ts)
        self._snapshot_families(f, snap)
        self._acc.families(f)
        if self._store is not None:
            size = self._store.data_bytes()
            if size is not None:
                f.value(GaugeMetricFamily, "gpudash_store_data_bytes", "Bytes of data in the SQLite store.", {}, size)
            if self._store.max_bytes is not None:
                f.value(GaugeMetricFamily, "gpudash_store_max_bytes", "The store's size cap ([store] max_bytes).",
                        {}, self._store.max_bytes)
        yield from f.families.values()

    @staticmethod
    def _snapshot_families(f: _Families, snap: Snapshot) -> None:
        for g in snap.gpus:
            labels = {"gpu": str(g.index), "uuid": g.uuid, "name": g.name}
            f.add(_GPU, g, labels)
            f.add(_GPU_COUNTERS, g, labels, counter=True)
            cap = link_capacity_bps(g.link_gen, g.link_width)
            if cap is not None:
                f.value(GaugeMetricFamily, "gpudash_gpu_pcie_link_capacity_bytes_per_second",
                        "Payload one direction of the current PCIe link can carry.", labels, cap)
        if snap.host is not None:
            f.add(_HOST, snap.host, {})
        for p in snap.engine_paths:
            labels = {"path": p.path, "gpu": str(p.gpu), "direction": p.direction, "server": p.server or ""}
            f.add(_PATH, p, labels)
            f.add(_PATH_COUNTERS, p, labels, counter=True)
        for pool in snap.pools:
            f.add(_POOL, pool, {"pool": pool.pool})
        for s in snap.pool_shards:
            labels = {"pool": s.pool, "shard": s.shard}
            f.add(_SHARD, s, labels)
            f.add(_SHARD_COUNTERS, s, labels, counter=True)
        for s in snap.servers:
            labels = {"server": s.server, "kind": s.kind}
            f.add(_SERVER, s, labels)
            f.add(_SERVER_COUNTERS, s, labels, counter=True)
            f.value(GaugeMetricFamily, "gpudash_server_up", "1 while the server answers (ready or sleeping).",
                    labels, s.state.up)
            for state in SERVER_STATES:
                f.value(GaugeMetricFamily, "gpudash_server_state", "1 for the state the server is in, else 0.",
                        {**labels, "state": state.value}, s.state is state)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
