"""The energy series of a real scrape of a real sink: the GPU counter (left out, GPU by GPU, where the box's
dcgm-exporter, here the stand-in built from its default counters file, exports
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION), and each server's energy and token counters."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpudash.config import PrometheusConfig
from gpudash.records import GpuSample, ServerEnergySample, ServerSample, Snapshot
from gpudash.telemetry.prometheus import PrometheusSink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))
import dcgm_standin  # noqa: E402
from fleet_helpers import serving  # noqa: E402

GPUS = [{"gpu": 0, "uuid": "GPU-a", "model": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0"},
        {"gpu": 1, "uuid": "GPU-b", "model": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:2A:00.0"}]


def snapshot() -> Snapshot:
    gpus = (GpuSample(1.0, 0, "GPU-a", "H100", power_w=300.0, energy_j=5_000_123.5, energy_source="counter"),
            GpuSample(1.0, 1, "GPU-b", "H100", power_w=200.0, energy_j=42.0, energy_source="integrated"))
    servers = (ServerSample(1.0, "chat", "llama.cpp", "ready"),)
    energy = (ServerEnergySample(1.0, "chat", "0,1", "sm_share", busy_j=900.0, idle_j=100.0, generation_tokens=500.0,
                                 prompt_tokens=2000.0),)
    return Snapshot(1.0, 0, "sim:h200", gpus=gpus, servers=servers, server_energy=energy)


def scrape(settings: PrometheusConfig) -> list:
    sink = PrometheusSink("127.0.0.1", 0, settings=settings)
    try:
        if sink.dcgm is not None:
            assert sink.dcgm.asked.wait(10), "the dcgm-exporter watch never asked"
        sink(snapshot())
        text = httpx.get(f"http://127.0.0.1:{sink.port}/metrics", trust_env=False).text
    finally:
        sink.close()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_the_gpu_energy_counter_and_how_it_was_had() -> None:
    samples = scrape(PrometheusConfig(gpu="all"))
    energy = {s.labels["UUID"]: s.value for s in samples if s.name == "gpudash_gpu_energy_joules_total"}
    assert energy == {"GPU-a": 5_000_123.5, "GPU-b": 42.0}
    how = {s.labels["UUID"]: s.labels["method"] for s in samples if s.name == "gpudash_gpu_energy_joules_total"}
    assert how == {"GPU-a": "counter", "GPU-b": "integrated"}


def test_auto_leaves_out_the_gpus_whose_energy_dcgm_exporter_exports() -> None:
    with serving(dcgm_standin.serve("127.0.0.1", 0, dcgm_standin.exposition(GPUS[:1], "box-01"))) as port:
        samples = scrape(PrometheusConfig(gpu="auto", dcgm_exporter=f"http://127.0.0.1:{port}/metrics"))
    assert {s.labels["UUID"] for s in samples if s.name == "gpudash_gpu_energy_joules_total"} == {"GPU-b"}


def test_server_energy_and_tokens_are_counters_with_state_and_split() -> None:
    samples = scrape(PrometheusConfig(gpu="all"))
    energy = {(s.labels["state"], s.labels["split"]): s.value for s in samples
              if s.name == "gpudash_server_energy_joules_total"}
    assert energy == {("busy", "sm_share"): 900.0, ("idle", "sm_share"): 100.0}
    tokens = {s.name: (s.labels["server"], s.labels["kind"], s.value) for s in samples
              if s.name in ("gpudash_server_generation_tokens_total", "gpudash_server_prompt_tokens_total")}
    assert tokens == {"gpudash_server_generation_tokens_total": ("chat", "llama.cpp", 500.0),
                      "gpudash_server_prompt_tokens_total": ("chat", "llama.cpp", 2000.0)}
