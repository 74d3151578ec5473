"""Prometheus exposition: a sampler sink that serves the latest Snapshot's values over HTTP.

The sink keeps a reference to the newest (immutable) Snapshot plus what accumulates across ticks (GPU
faults here, the probe's requests in prom_servers.py); a custom collector turns them into metric
families when Prometheus scrapes, so a scrape never sees half a tick. Names follow Prometheus' naming
guide (prometheus.io/docs/practices/naming): base units (`_bytes`, `_seconds`, `_ratio`, `_hertz`),
`_total` on counters, one `gpudash_box_info` per target with the facts that tell boxes apart (the
scrape's `instance` plus that info metric identify a box), and the client library's standard
`process_*` families for gpudash's own CPU and memory.

gpudash lives beside dcgm-exporter and the servers' own /metrics (dcgm.py, prom_servers.py): every GPU
series carries dcgm-exporter's GPU labels (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
`Hostname`), so `* on(UUID)` joins the two both ways, and `[prometheus] gpu` leaves out the figures a
dcgm-exporter on the box already exports; server series are only what the server does not export
itself unless `[prometheus] servers = "all"`. Series about the box carry `source` (`nvml` or
`sim:<profile>`). Binds 127.0.0.1 unless a host is given; prom_http.py serves it under idle and header
deadlines and a connection cap, and the `gpudash_exporter_connections_*` series say how that goes.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import PROCESS_COLLECTOR, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from gpudash.config import Config, PrometheusConfig
from gpudash.gpu.device import CLOCK_EVENT_REASONS
from gpudash.labels import NVML_LABEL
from gpudash.records import GPU_FAULT_KINDS, GpuSample, Snapshot
from gpudash.redact import remember_config
from gpudash.telemetry.dcgm import OWN_LEFT_OUT, DcgmWatch
from gpudash.telemetry.links import link_capacity_bps
from gpudash.telemetry.prom_build import Families
from gpudash.telemetry.prom_http import DROP_REASONS, ServeLimits, serve
from gpudash.telemetry.prom_servers import ServerFamilies, energy_families

DEFAULT_HOST = "127.0.0.1"

# (record field, metric name, help, scale, counter) per record kind; a None value (NA) is left out, never 0.
_GPU = (
    ("util_pct", "gpudash_gpu_utilization_ratio", "GPU utilisation, 0..1.", 0.01, False),
    ("mem_used", "gpudash_gpu_memory_used_bytes", "GPU memory in use.", 1, False),
    ("mem_total", "gpudash_gpu_memory_total_bytes", "GPU memory in total.", 1, False),
    ("power_w", "gpudash_gpu_power_watts", "GPU board power.", 1, False),
    ("temp_c", "gpudash_gpu_temperature_celsius", "GPU temperature.", 1, False),
    ("sm_clock_mhz", "gpudash_gpu_sm_clock_hertz", "SM clock.", 1e6, False),
    ("pcie_tx_bps", "gpudash_gpu_pcie_tx_bytes_per_second",
     "PCIe payload sent by the GPU (to host), protocol overhead left out.", 1, False),
    ("pcie_rx_bps", "gpudash_gpu_pcie_rx_bytes_per_second",
     "PCIe payload received by the GPU (from host), protocol overhead left out.", 1, False),
    ("link_gen", "gpudash_gpu_pcie_link_generation", "Current PCIe link generation.", 1, False),
    ("link_width", "gpudash_gpu_pcie_link_width", "Current PCIe link width (lanes).", 1, False),
    ("link_gen_max", "gpudash_gpu_pcie_link_generation_max", "Maximum PCIe link generation.", 1, False),
    ("link_width_max", "gpudash_gpu_pcie_link_width_max", "Maximum PCIe link width (lanes).", 1, False),
    ("bar1_total", "gpudash_gpu_bar1_total_bytes", "BAR1 aperture size.", 1, False),
    ("bar1_used", "gpudash_gpu_bar1_used_bytes", "BAR1 aperture in use.", 1, False),
    ("remapped_rows", "gpudash_gpu_remapped_rows", "Rows remapped after uncorrectable errors.", 1, False),
    ("ecc_uncorrected", "gpudash_gpu_ecc_uncorrected_errors", "Volatile uncorrected ECC errors since boot.", 1,
     True),
    ("pcie_tx_wire_bytes", "gpudash_gpu_pcie_tx_bytes", "PCIe wire bytes sent by the GPU (to host): payload plus "
     "packet overhead (TLP/DLLP headers, framing), as NVML counts them (a sim link has no overhead).", 1, True),
    ("pcie_rx_wire_bytes", "gpudash_gpu_pcie_rx_bytes", "PCIe wire bytes received by the GPU (from host): payload "
     "plus packet overhead (TLP/DLLP headers, framing), as NVML counts them (a sim link has no overhead).", 1, True),
    ("pcie_replay_errors", "gpudash_gpu_pcie_replay_errors", "PCIe link replays (packets retransmitted after a link "
     "error) since boot.", 1, True),
)
_HOST = (
    ("cpu_pct", "gpudash_host_cpu_utilization_ratio", "Host CPU use, 0..1 of all cores.", 0.01, False),
    ("mem_used", "gpudash_host_memory_used_bytes", "Host memory in use.", 1, False),
    ("mem_total", "gpudash_host_memory_total_bytes", "Host memory in total.", 1, False),
)
_PATH = (
    ("queue_depth", "gpudash_engine_path_queue_depth", "Chunks queued on the path.", 1, False),
    ("bytes_total", "gpudash_engine_path_bytes", "Payload bytes the path moved.", 1, True),
    ("chunks_total", "gpudash_engine_path_chunks", "Chunks the path moved.", 1, True),
    ("cpu_s", "gpudash_engine_path_cpu_seconds", "CPU time the path's copies took.", 1, True),
)
_POOL = (
    ("slab", "gpudash_pool_slab_bytes", "Pool slab size (every shard plus what is unassigned).", 1, False),
    ("unassigned", "gpudash_pool_unassigned_bytes", "Slab bytes no shard owns (room to add or grow shards).", 1,
     False),
)
_SHARD = (
    ("capacity", "gpudash_pool_shard_capacity_bytes", "Pool shard capacity.", 1, False),
    ("used", "gpudash_pool_shard_used_bytes", "Pool shard bytes in use.", 1, False),
    ("largest_free", "gpudash_pool_shard_largest_free_bytes", "Largest free block of the shard.", 1, False),
    ("fragmentation", "gpudash_pool_shard_fragmentation_ratio", "1 - largest free block / free bytes.", 1, False),
    ("failures", "gpudash_pool_shard_allocation_failures", "Allocations the shard refused.", 1, True),
)
FAULT_KINDS = tuple(k.removeprefix("gpu.") for k in GPU_FAULT_KINDS)  # xid, ecc, lost


def parse_listen(value: str) -> tuple[str, int]:
    """(host, port) from ``PORT``, ``HOST:PORT`` or ``[IPv6]:PORT``; ValueError in one sentence otherwise."""
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]") if sep else DEFAULT_HOST
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 1 <= number <= 65535 or (sep and not host):
        raise ValueError(f"--prometheus expects [HOST:]PORT with a port from 1 to 65535 (e.g. 9401 or "
                         f"0.0.0.0:9401), got {value!r}")
    return host, number


def open_sink(listen: str, store: StoreSize | None = None, config: Config | None = None) -> PrometheusSink:
    """A serving sink at `listen` ([HOST:]PORT) with `config`'s [prometheus] choices, its servers' secrets
    remembered for masking (redact.py); ValueError in one sentence for an address that is not one or a port
    that cannot be bound."""
    host, port = parse_listen(listen)
    config = config or Config()
    remember_config(config)
    try:
        return PrometheusSink(host, port, store=store, settings=config.prometheus)
    except OSError as err:
        raise ValueError(f"cannot serve Prometheus on {host}:{port} ({err.strerror}); pick another [HOST:]PORT "
                         "for --prometheus") from None


def hostname() -> str:
    """The box's name as dcgm-exporter gives it (its `Hostname` label): NODE_NAME when set (Kubernetes), else
    the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def gpudash_version() -> str:
    """The installed gpudash's version ("unknown" when run from a tree that was never installed)."""
    try:
        return importlib.metadata.version("gpudash")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def box_facts(source: str) -> dict[str, str]:
    """The labels of gpudash_box_info: what tells one box from another beside the scrape's instance. The host
    is `Hostname`, spelled as on every GPU series (dcgm-exporter's label)."""
    driver = cuda = "none"
    if source == NVML_LABEL:
        from gpudash.gpu import nvml

        driver, cuda = nvml.driver_version() or "unknown", nvml.cuda_driver_version() or "unknown"
    return {"Hostname": hostname(), "driver": driver, "cuda": cuda, "rig": source, "version": gpudash_version()}


def pci_bus_ids(source: str) -> dict[str, str]:
    """UUID -> PCI bus id as NVML spells it ("00000000:18:00.0"), for dcgm-exporter's `pci_bus_id` label; a
    simulated rig's GPUs have none."""
    if source != NVML_LABEL:
        return {}
    from gpudash.gpu.device import devices

    try:
        return {d.static.uuid: d.static.pci_bus_id for d in devices()}
    except Exception:  # a driver that went away between ticks: the label is left empty, the series stay
        return {}


@dataclass(frozen=True, slots=True)
class StoreSize:
    """The SQLite file a recorder writes and its configured cap, read when Prometheus scrapes."""

    path: Path
    max_bytes: int | None

    def data_bytes(self) -> int | None:
        """Bytes of pages in use (what `[store] max_bytes` caps), or None when the file cannot be read."""
        try:
            # as a URI whose path is quoted: a `?` or `#` in the file name would start its query or fragment
            # closing(): sqlite3's own `with` ends a transaction, not the connection (3.13 warns of it unclosed)
            with closing(sqlite3.connect(f"{Path(self.path).absolute().as_uri()}?mode=ro", uri=True,
                                         timeout=0.5)) as db:
                pages = db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
                return pages * db.execute("PRAGMA page_size").fetchone()[0]
        except sqlite3.Error:
            return None


def _add(f: Families, spec: tuple[tuple[str, str, str, float, bool], ...], record: object, labels: dict[str, str],
         keep: Callable[[str], bool] | None = None) -> None:
    """One series per field of `spec` that `record` has (NA is left out); `keep(name)` may leave more out."""
    for attr, name, doc, scale, counter in spec:
        value = getattr(record, attr)
        if value is not None and (keep is None or keep(name)):
            f.value(CounterMetricFamily if counter else GaugeMetricFamily, name, doc, labels, value * scale)


class _GpuFaults:
    """Xid, double-bit ECC and GPU-lost events counted per GPU and kind across ticks, and each GPU's last Xid."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple[int, str], int] = {}
        self.last_xid: dict[int, int] = {}

    def add(self, snap: Snapshot) -> None:
        with self.lock:
            for g in snap.gpus:
                for kind in FAULT_KINDS:
                    self.counts.setdefault((g.index, kind), 0)
            for e in snap.events:
                gpu = e.target.removeprefix("GPU")
                if e.kind in GPU_FAULT_KINDS and gpu.isdigit():
                    key = (int(gpu), e.kind.removeprefix("gpu."))
                    self.counts[key] = self.counts.get(key, 0) + 1
                    if e.kind == "gpu.xid" and isinstance(e.new, int):
                        self.last_xid[int(gpu)] = e.new


class PrometheusSink:
    """Sampler sink + collector; `close()` stops the HTTP server (and the dcgm-exporter watch)."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = 0, store: StoreSize | None = None,
                 settings: PrometheusConfig | None = None, limits: ServeLimits | None = None) -> None:
        self._latest: Snapshot | None = None
        self._facts: dict[str, str] | None = None
        self._bus: dict[str, str] = {}
        self._faults = _GpuFaults()
        self._version = gpudash_version()
        self.settings = settings or PrometheusConfig()
        self._servers = ServerFamilies(self.settings.servers == "all")
        self._store = store
        self.dcgm = DcgmWatch(self.settings.dcgm_exporter) if self.settings.gpu == "auto" else None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        registry.register(PROCESS_COLLECTOR)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        try:
            self._server, self._thread = serve(host, port, make_wsgi_app(registry), limits or ServeLimits())
        except OSError:
            if self.dcgm is not None:
                self.dcgm.close()
            raise
        self.host, self.port = host, self._server.server_address[1]

    def __call__(self, snap: Snapshot) -> None:
        self._faults.add(snap)
        self._servers.add(snap)
        if self._facts is None or self._facts["rig"] != snap.source:
            self._facts = box_facts(snap.source)
            self._bus = pci_bus_ids(snap.source)
        self._latest = snap

    def keep(self, name: str, uuid: str) -> bool:
        """Whether GPU family `name` is served for the GPU `uuid` under `[prometheus] gpu`."""
        if self.settings.gpu == "own":
            return name not in OWN_LEFT_OUT
        return self.dcgm is None or not self.dcgm.left_out(name, uuid)

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily("gpudash_build_info", "The gpudash serving these series: its version (value 1).",
                                  labels=["version"])
        build.add_metric([self._version], 1)
        yield build
        yield from self._connection_families()
        snap, facts = self._latest, self._facts
        if snap is None or facts is None:
            return
        info = GaugeMetricFamily("gpudash_box_info", "The box: Hostname, NVIDIA driver, CUDA, rig and gpudash "
                                 "version (value 1).", labels=list(facts))
        info.add_metric(list(facts.values()), 1)
        yield info
        f = Families(snap.source)
        f.value(CounterMetricFamily, "gpudash_sampler_ticks", "Sampler ticks taken.", {}, snap.tick + 1)
        f.value(GaugeMetricFamily, "gpudash_sample_timestamp_seconds", "When the values served were sampled.",
                {}, snap.ts)
        self._gpu_families(f, snap.gpus, facts["Hostname"])
        self._box_families(f, snap)
        self._servers.families(f, snap.servers)
        energy_families(f, snap.server_energy, snap.servers)
        if self._store is not None:
            size = self._store.data_bytes()
            if size is not None:
                f.value(GaugeMetricFamily, "gpudash_store_data_bytes", "Bytes of data in the SQLite store.", {}, size)
            if self._store.max_bytes is not None:
                f.value(GaugeMetricFamily, "gpudash_store_max_bytes", "The store's size cap ([store] max_bytes).",
                        {}, self._store.max_bytes)
        yield from f.families.values()

    def _connection_families(self) -> Iterator[Metric]:
        """How the HTTP server copes with its clients (prom_http.py): connections held, the cap, drops."""
        held, cap, dropped = self._server.stats()
        yield GaugeMetricFamily("gpudash_exporter_connections_open", "Connections to this endpoint held now (those being "
                                "closed included: at most twice the cap).",
                                value=held)
        yield GaugeMetricFamily("gpudash_exporter_connections_max", "The most connections held at once (beyond it "
                                "the longest-waiting one is closed).", value=cap)
        fam = CounterMetricFamily("gpudash_exporter_connections_dropped", "Connections closed by the exporter: "
                                  "beyond the cap, silent past the idle deadline, or a request head not in by the "
                                  "header deadline.", labels=["reason"])
        for reason in DROP_REASONS:
            fam.add_metric([reason], dropped[reason])
        yield fam

    def gpu_labels(self, g: GpuSample, host: str) -> dict[str, str]:
        """dcgm-exporter's label set for GPU `g` (dcgm.LABELS)."""
        return {"gpu": str(g.index), "UUID": g.uuid, "pci_bus_id": self._bus.get(g.uuid, ""),
                "device": f"nvidia{g.index}", "modelName": g.name, "Hostname": host}

    def _gpu_families(self, f: Families, gpus: Sequence[GpuSample], host: str) -> None:
        with self._faults.lock:
            counts, last_xid = dict(self._faults.counts), dict(self._faults.last_xid)
        for g in gpus:
            labels = self.gpu_labels(g, host)
            _add(f, _GPU, g, labels, lambda name, uuid=g.uuid: self.keep(name, uuid))
            cap = link_capacity_bps(g.link_gen, g.link_width)
            if cap is not None:
                f.value(GaugeMetricFamily, "gpudash_gpu_pcie_link_capacity_bytes_per_second",
                        "Payload one direction of the current PCIe link can carry.", labels, cap)
            for kind in FAULT_KINDS:
                f.value(CounterMetricFamily, "gpudash_gpu_fault_events",
                        "Xid, double-bit ECC and GPU-lost events the driver reported.", {**labels, "kind": kind},
                        counts.get((g.index, kind), 0))
            if g.clock_events is not None:
                for bit, reason, _ in CLOCK_EVENT_REASONS:
                    f.value(GaugeMetricFamily, "gpudash_gpu_clock_event_active", "1 while this clock-event "
                            "(throttle) reason holds the GPU's clocks, else 0 (NVML's clock event reasons).",
                            {**labels, "reason": reason}, bool(g.clock_events & bit))
            if g.energy_j is not None and self.keep("gpudash_gpu_energy_joules", g.uuid):
                f.value(CounterMetricFamily, "gpudash_gpu_energy_joules", "GPU energy; method: counter (the driver's, "
                        "since it loaded), integrated (board power over ticks, since gpudash started), sim.",
                        {**labels, "method": g.energy_source or "counter"}, g.energy_j)
            if g.index in last_xid and self.keep("gpudash_gpu_last_xid", g.uuid):
                f.value(GaugeMetricFamily, "gpudash_gpu_last_xid", "The last Xid code the GPU reported.", labels,
                        last_xid[g.index])

    @staticmethod
    def _box_families(f: Families, snap: Snapshot) -> None:
        if snap.host is not None:
            _add(f, _HOST, snap.host, {})
        for p in snap.engine_paths:
            _add(f, _PATH, p, {"path": p.path, "gpu": str(p.gpu), "direction": p.direction, "server": p.server or ""})
        for pool in snap.pools:
            _add(f, _POOL, pool, {"pool": pool.pool})
        for s in snap.pool_shards:
            _add(f, _SHARD, s, {"pool": s.pool, "shard": s.shard})

    def close(self) -> None:
        self._server.close_all()
        self._thread.join(timeout=5)
        if self.dcgm is not None:
            self.dcgm.close()
