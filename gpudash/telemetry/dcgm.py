"""gpudash beside NVIDIA's dcgm-exporter: which of gpudash's GPU families are the same figure as one of its
fields, and which of those a dcgm-exporter on this box exports now, GPU by GPU.

Most GPU boxes that Prometheus scrapes already run dcgm-exporter. gpudash's GPU series carry its label set
(LABELS, so `* on(UUID)` joins them) and, under `[prometheus] gpu = "auto"`, leave out each figure that the
box's dcgm-exporter exports for that GPU: `DcgmWatch` asks it once a minute in the background. Under
"own" the figures of dcgm-exporter's default counters are left out without asking. gpudash's PCIe rates
are payload bytes (the link's wire bytes less the protocol overhead) and are not the same figure as
DCGM_FI_PROF_PCIE_TX_BYTES (headers included), so they stay, beside what the link carries; nor are gpudash's
wire-byte counters (`gpudash_gpu_pcie_tx_bytes_total`: dcgm-exporter serves PCIe bytes only as that rate).
`gpudash_gpu_clock_event_active{reason}` stays too: dcgm-exporter's clock-event series
(DCGM_EXP_CLOCK_EVENTS_COUNT) is not among its default counters and counts events rather than saying which
reason holds now.

Names and labels are those of dcgm-exporter 4.5.3-4.8.2 (internal/pkg/rendermetrics/render_metrics.go,
etc/default-counters.csv); its next release spells `Hostname` as `hostname`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from gpudash.launcher.scrape_http import Scraper, ScrapeError

# dcgm-exporter's GPU labels, in its order: the NVML index, the GPU's UUID, its PCI bus id, "nvidia<index>",
# the model name and the node's name (NODE_NAME, else the host name).
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")

# gpudash GPU family -> the dcgm-exporter fields that carry the same figure (all of them needed).
TWINS: dict[str, tuple[str, ...]] = {
    "gpudash_gpu_utilization_ratio": ("DCGM_FI_DEV_GPU_UTIL",),
    "gpudash_gpu_memory_used_bytes": ("DCGM_FI_DEV_FB_USED",),
    "gpudash_gpu_memory_total_bytes": ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"),
    "gpudash_gpu_power_watts": ("DCGM_FI_DEV_POWER_USAGE",),
    "gpudash_gpu_temperature_celsius": ("DCGM_FI_DEV_GPU_TEMP",),
    "gpudash_gpu_sm_clock_hertz": ("DCGM_FI_DEV_SM_CLOCK",),
    "gpudash_gpu_last_xid": ("DCGM_FI_DEV_XID_ERRORS",),
    "gpudash_gpu_remapped_rows": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",),
    "gpudash_gpu_ecc_uncorrected_errors": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",),
    "gpudash_gpu_pcie_replay_errors": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",),
    "gpudash_gpu_bar1_used_bytes": ("DCGM_FI_DEV_BAR1_USED",),
    "gpudash_gpu_bar1_total_bytes": ("DCGM_FI_DEV_BAR1_TOTAL",),
    "gpudash_gpu_pcie_link_generation": ("DCGM_FI_DEV_PCIE_LINK_GEN",),
    "gpudash_gpu_pcie_link_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH",),
    "gpudash_gpu_pcie_link_generation_max": ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN",),
    "gpudash_gpu_pcie_link_width_max": ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",),
    "gpudash_gpu_energy_joules": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",),  # the same counter, in mJ
}
# The fields of those that dcgm-exporter 4.5.3-4.8.2 exports with its default counters
# (etc/default-counters.csv, lines not commented out).
DEFAULT_FIELDS = frozenset({
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
})
# What `gpu = "own"` leaves out: every family whose twin fields are all default counters.
OWN_LEFT_OUT = frozenset(f for f, fields in TWINS.items() if set(fields) <= DEFAULT_FIELDS)

ASK_EVERY_S = 60.0
ASK_TIMEOUT_S = 2.0


def covered(exposition: str) -> frozenset[tuple[str, str]]:
    """(gpudash family, UUID) pairs whose figure a dcgm-exporter's /metrics text carries; ValueError when
    the text is not Prometheus' format."""
    seen: set[tuple[str, str]] = set()
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:  # (the family's name: the parser adds `_total` to a counter's samples)
            uuid = s.labels.get("UUID") or s.labels.get("uuid")  # `uuid` with dcgm-exporter's -u (old names)
            if uuid:
                seen.add((family.name, uuid))
    return twins_of(seen)


def twins_of(seen: Iterable[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """The gpudash (family, UUID) pairs that the (dcgm field, UUID) pairs in `seen` stand for."""
    fields: dict[str, set[str]] = {}
    for name, uuid in seen:
        fields.setdefault(uuid, set()).add(name)
    return frozenset((family, uuid) for uuid, names in fields.items() for family, need in TWINS.items()
                     if set(need) <= names)


class DcgmWatch:
    """Asks the dcgm-exporter at `url` what it exports, now and every ASK_EVERY_S, on its own thread (a
    scrape never waits for it). `left_out(family, uuid)` says whether gpudash leaves a series out; while
    no dcgm-exporter answers, nothing is. `error` holds why the last ask failed (None: it answered)."""

    def __init__(self, url: str, every_s: float = ASK_EVERY_S, timeout_s: float = ASK_TIMEOUT_S) -> None:
        parts = urlsplit(url)
        self._base = f"{parts.scheme}://{parts.netloc}"
        self._path = parts.path or "/metrics"
        self._http = Scraper(timeout_s, timeout_s)
        self._every_s = every_s
        self.covered: frozenset[tuple[str, str]] = frozenset()
        self.error: str | None = "not asked yet"
        self.asked = threading.Event()  # set after each ask (tests wait on it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpudash-dcgm-watch", daemon=True)
        self._thread.start()

    def left_out(self, family: str, uuid: str) -> bool:
        return (family, uuid) in self.covered

    def ask(self) -> None:
        try:
            status, body = self._http.get(self._base, self._path)
            if status != 200:
                raise ScrapeError(f"HTTP {status}")
            self.covered, self.error = covered(body.decode("utf-8", "replace")), None
        except (ScrapeError, ValueError) as err:  # none there (the usual case), or not an exporter
            self.covered, self.error = frozenset(), str(err) or type(err).__name__
        self.asked.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.ask()
            self._stop.wait(self._every_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._http.close()
