"""gpudash's GPU series beside dcgm-exporter: the same label set (so `on(UUID)` joins both ways), and under
`[prometheus] gpu` nothing exported twice: "auto" asks the box's dcgm-exporter (here the stand-in built from
its 4.5.3-4.8.2 default counters file, served over real HTTP) and leaves out, GPU by GPU, what it exports;
"own" leaves out what its default counters carry; "all" leaves out nothing. Real scrapes of a real sink."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.config import PrometheusConfig
from gpudash.records import Event, GpuSample, Snapshot
from gpudash.telemetry.dcgm import LABELS, OWN_LEFT_OUT, TWINS, covered
from gpudash.telemetry.prometheus import PrometheusSink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))
import dcgm_standin  # noqa: E402
from fleet_helpers import serving  # noqa: E402

GPUS = [{"gpu": 0, "uuid": "GPU-a", "model": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0"},
        {"gpu": 1, "uuid": "GPU-b", "model": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:2A:00.0"}]


def gpu_sample(index: int) -> GpuSample:
    return GpuSample(1.0, index, GPUS[index]["uuid"], GPUS[index]["model"], util_pct=40.0, mem_used=1, mem_total=2,
                     power_w=300.0, temp_c=50.0, sm_clock_mhz=1980, pcie_tx_bps=1e9, pcie_rx_bps=2e9, link_gen=5,
                     link_width=16, link_gen_max=5, link_width_max=16, bar1_total=4, bar1_used=1, ecc_uncorrected=0,
                     remapped_rows=0, pcie_tx_wire_bytes=10, pcie_rx_wire_bytes=20, pcie_replay_errors=0,
                     clock_events=0, energy_j=1e6 + index, energy_source="counter")


def scrape(settings: PrometheusConfig, gpus: int = 2) -> dict[str, dict[str, set[str]]]:
    """{family: {UUID: label names}} of a real scrape of a sink with `settings` after one snapshot."""
    sink = PrometheusSink("127.0.0.1", 0, settings=settings)
    try:
        if sink.dcgm is not None:
            assert sink.dcgm.asked.wait(10), "the dcgm-exporter watch never asked"
        xids = tuple(Event(1.0, "driver", "gpu.xid", f"GPU{i}", new=79, ok=False) for i in range(gpus))
        sink(Snapshot(1.0, 0, "sim:h200", gpus=tuple(gpu_sample(i) for i in range(gpus)), events=xids))
        text = httpx.get(f"http://127.0.0.1:{sink.port}/metrics", trust_env=False).text
    finally:
        sink.close()
    out: dict[str, dict[str, set[str]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "UUID" in s.labels:
                out.setdefault(fam.name, {})[s.labels["UUID"]] = set(s.labels)
    return out


@pytest.fixture
def dcgm_exporter() -> Iterator[str]:
    """The stand-in, exporting GPU-a only (a dcgm-exporter run with -d for one GPU), on a free port."""
    with serving(dcgm_standin.serve("127.0.0.1", 0, dcgm_standin.exposition(GPUS[:1], "box-01"))) as port:
        yield f"http://127.0.0.1:{port}/metrics"


def test_every_gpu_series_carries_dcgm_exporters_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-7")  # dcgm-exporter's Hostname in Kubernetes
    fams = scrape(PrometheusConfig(gpu="all"))
    standin = next(f for f in text_string_to_metric_families(dcgm_standin.exposition(GPUS, "x"))
                   if f.name == "DCGM_FI_DEV_GPU_UTIL")
    theirs = set(standin.samples[0].labels) - {"DCGM_FI_DRIVER_VERSION"}  # a label counter, not an identity
    assert theirs == set(LABELS)
    gpu_families = [n for n in fams if n.startswith("gpudash_gpu_")]
    assert len(gpu_families) >= 17
    for name in gpu_families:
        for uuid, labels in fams[name].items():
            assert set(LABELS) <= labels, name
            assert labels - set(LABELS) <= {"source", "kind", "reason", "method"}, name  # the faults' kind,
            # clock events' reason, the energy counter's method
    sink = PrometheusSink("127.0.0.1", 0, settings=PrometheusConfig(gpu="all"))
    try:
        sink(Snapshot(1.0, 0, "sim:h200", gpus=(gpu_sample(1),)))
        labels = sink.gpu_labels(gpu_sample(1), "node-7")
    finally:
        sink.close()
    assert labels == {"gpu": "1", "UUID": "GPU-b", "pci_bus_id": "", "device": "nvidia1",
                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-7"}


def test_auto_leaves_out_per_gpu_what_the_boxs_dcgm_exporter_exports(dcgm_exporter: str) -> None:
    fams = scrape(PrometheusConfig(gpu="auto", dcgm_exporter=dcgm_exporter))
    for family in OWN_LEFT_OUT:  # what the default counters carry: GPU-a's left to dcgm-exporter, GPU-b's served
        assert set(fams.get(family, {})) == {"GPU-b"}, family
    for family in ("gpudash_gpu_pcie_link_generation", "gpudash_gpu_pcie_link_width_max",
                   "gpudash_gpu_pcie_tx_bytes_per_second", "gpudash_gpu_pcie_link_capacity_bytes_per_second",
                   "gpudash_gpu_bar1_used_bytes", "gpudash_gpu_ecc_uncorrected_errors", "gpudash_gpu_fault_events",
                   "gpudash_gpu_pcie_tx_bytes", "gpudash_gpu_pcie_rx_bytes", "gpudash_gpu_clock_event_active"):
        assert set(fams[family]) == {"GPU-a", "GPU-b"}, family  # only gpudash knows these


def test_auto_serves_everything_while_no_dcgm_exporter_answers() -> None:
    fams = scrape(PrometheusConfig(gpu="auto", dcgm_exporter="http://127.0.0.1:9/metrics"))
    assert all(set(fams.get(f, {})) == {"GPU-a", "GPU-b"} for f in TWINS if f in fams)
    assert OWN_LEFT_OUT <= set(fams)


def test_own_leaves_out_what_dcgm_exporters_default_counters_carry_and_all_nothing() -> None:
    own, every = scrape(PrometheusConfig(gpu="own")), scrape(PrometheusConfig(gpu="all"))
    assert set(every) - set(own) == OWN_LEFT_OUT
    assert OWN_LEFT_OUT <= set(every)


def test_own_is_exactly_what_a_default_dcgm_exporter_covers() -> None:
    """Built from dcgm-exporter's own counters file: its default series stand for these gpudash families."""
    exported = covered(dcgm_standin.exposition(GPUS[:1], "x"))
    assert {family for family, _ in exported} == OWN_LEFT_OUT
    assert {"gpudash_gpu_utilization_ratio", "gpudash_gpu_memory_used_bytes", "gpudash_gpu_power_watts",
            "gpudash_gpu_temperature_celsius"} <= OWN_LEFT_OUT
    # gpudash's PCIe rates are payload; dcgm-exporter's DCGM_FI_PROF_PCIE_* count the headers too, and it has no
    # counter of PCIe bytes: of the PCIe families only the replay counter is the same figure as one of its defaults
    assert {family for family in OWN_LEFT_OUT if "pcie" in family} == {"gpudash_gpu_pcie_replay_errors"}
