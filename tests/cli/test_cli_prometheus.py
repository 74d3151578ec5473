"""The Prometheus sink: address parsing, NA values left out, sim labels on every series about the box (real HTTP
scrape). What it leaves to dcgm-exporter and to the servers: tests/telemetry/test_prometheus_*.py."""

from __future__ import annotations

import dataclasses
import importlib.metadata

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.config import PrometheusConfig
from gpudash.engine import EngineConfig, TransferEngine
from gpudash.engine.pools import MemoryPool
from gpudash.records import GpuSample, HostSample, Snapshot
from gpudash.telemetry.pools import PoolSource
from gpudash.telemetry.prometheus import PrometheusSink, parse_listen

EXPORTER_FAMILIES = {"gpudash_exporter_connections_open", "gpudash_exporter_connections_max",
                     "gpudash_exporter_connections_dropped"}
from gpudash.telemetry.sampler import Sampler


ALL = PrometheusConfig(gpu="all", servers="all")  # every family, whatever runs beside (none asked)


@pytest.mark.parametrize("text, want", [("9400", ("127.0.0.1", 9400)), ("0.0.0.0:9401", ("0.0.0.0", 9401)),
                                         ("[::1]:80", ("::1", 80)), ("box.lan:65535", ("box.lan", 65535))])
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["", "x", "host:", ":9", "0", "70000", "a:b"])
def test_parse_listen_refuses_with_the_expected_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"expects \[HOST:\]PORT with a port from 1 to 65535"):
        parse_listen(text)


def info_host(fams: dict) -> str:
    return fams["gpudash_box_info"].samples[0].labels["Hostname"]


def test_scrape_serves_the_latest_snapshot_and_leaves_na_out() -> None:
    sink = PrometheusSink("127.0.0.1", 0, settings=ALL)
    port = sink._server.server_address[1]
    try:
        before = {f.name: f for f in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics").text)}
        assert "process_cpu_seconds" in before  # nothing sampled yet: gpudash's own build and connections alone
        assert {n for n in before if n.startswith("gpudash_")} == {"gpudash_build_info", *EXPORTER_FAMILIES}
        (build,) = before["gpudash_build_info"].samples
        assert build.value == 1 and build.labels == {"version": importlib.metadata.version("gpudash")}
        gpu = GpuSample(1.0, 0, "GPU-a", "NVIDIA H200", util_pct=40.0, pcie_rx_bps=3e9, power_w=None)
        sink(Snapshot(1.0, 0, "sim:h200", gpus=(gpu,), host=HostSample(1.0, cpu_pct=7.0)))
        sink(Snapshot(2.0, 1, "sim:h200", gpus=(dataclasses.replace(gpu, ts=2.0, util_pct=55.0),)))
        fams = {f.name: f for f in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics").text)}
    finally:
        sink.close()
    (util,) = fams["gpudash_gpu_utilization_ratio"].samples
    assert util.value == 0.55 and util.labels == {"gpu": "0", "UUID": "GPU-a", "pci_bus_id": "", "device": "nvidia0",
                                                  "modelName": "NVIDIA H200", "Hostname": info_host(fams),
                                                  "source": "sim:h200"}
    assert fams["gpudash_gpu_pcie_rx_bytes_per_second"].samples[0].value == 3e9
    assert "gpudash_gpu_power_watts" not in fams  # NA is absent, never a made-up 0
    assert "gpudash_host_cpu_utilization_ratio" not in fams  # the newest tick had no host sample
    assert fams["gpudash_sampler_ticks"].type == "counter"
    assert [s.value for s in fams["gpudash_sampler_ticks"].samples if s.name.endswith("_total")] == [2]
    (info,) = fams["gpudash_box_info"].samples
    assert info.value == 1 and info.labels["rig"] == "sim:h200" and info.labels["driver"] == "none"
    assert set(info.labels) == {"Hostname", "driver", "cuda", "rig", "version"}
    assert "process_cpu_seconds" in fams  # the client library's standard process families


def test_every_family_follows_the_naming_guide() -> None:
    """Counters end in _total, gauges never do, and a unit-bearing name ends in a base unit."""
    from gpudash.records import EnginePathSample, Event, PoolSample, PoolShardSample, RequestSample, ServerSample

    sink = PrometheusSink("127.0.0.1", 0, settings=ALL)
    gpu = GpuSample(1.0, 0, "GPU-a", "NVIDIA H200", util_pct=40.0, mem_used=1, mem_total=2, power_w=100.0,
                    temp_c=50.0, sm_clock_mhz=1980, pcie_tx_bps=1.0, pcie_rx_bps=2.0, link_gen=5, link_width=16,
                    link_gen_max=5, link_width_max=16, ecc_uncorrected=0, remapped_rows=0, pcie_tx_wire_bytes=2**40,
                    pcie_rx_wire_bytes=3, pcie_replay_errors=7, clock_events=0x4 | 0x40)
    server = ServerSample(1.0, "chat", "vllm", "ready", tokens_per_s=5.0, kv_cache_usage=0.5,
                          prefix_cache_queries=10.0, prefix_cache_hits=5.0, ttft_mean_s=0.2, restarts=1)
    req = RequestSample(0.0, "chat", ttft_s=0.3, total_s=0.5, prompt_tokens=100, cached_tokens=90)
    snap = Snapshot(10.0, 0, "sim:h200", gpus=(gpu,), host=HostSample(1.0, cpu_pct=7.0, mem_used=1, mem_total=2),
                    engine_paths=(EnginePathSample(1.0, "direct", 0, None, "h2d", 10, 1, 0, 1.0, 0.1),),
                    pools=(PoolSample(1.0, "p", 4, 1),),
                    pool_shards=(PoolShardSample(1.0, "p", "kv", 3, 1, 2, 2, 1, 0.0, 0),),
                    servers=(server,), requests=(req,),
                    events=(Event(1.0, "driver", "gpu.xid", "GPU0", new=79, ok=False),))
    try:
        sink(snap)
        text = httpx.get(f"http://127.0.0.1:{sink._server.server_address[1]}/metrics").text
    finally:
        sink.close()
    fams = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("gpudash_")}
    units = ("_bytes", "_seconds", "_ratio", "_celsius", "_watts", "_hertz", "_bytes_per_second", "_info")
    banned = ("percent", "mhz", "gbps", "_ms", "kib", "mib")
    assert len(fams) >= 40
    for name, fam in fams.items():
        assert not any(b in name for b in banned), name
        if fam.type == "counter":
            assert all(s.name == name + "_total" or s.name == name + "_created" for s in fam.samples), name
        else:
            assert not name.endswith("_total"), name
    for name in ("gpudash_gpu_memory_used_bytes", "gpudash_gpu_sm_clock_hertz", "gpudash_server_kv_cache_usage_ratio",
                 "gpudash_gpu_utilization_ratio", "gpudash_box_info"):
        assert name.endswith(units)
    assert fams["gpudash_gpu_sm_clock_hertz"].samples[0].value == 1.98e9
    assert fams["gpudash_gpu_pcie_link_capacity_bytes_per_second"].samples[0].value > 50e9  # gen5 x16
    assert fams["gpudash_server_restarts"].type == "counter"
    states = {s.labels["state"]: s.value for s in fams["gpudash_server_state"].samples}
    assert states["ready"] == 1 and sum(states.values()) == 1 and "backoff" in states
    assert all("state" not in s.labels for s in fams["gpudash_server_up"].samples)
    faults = {(s.labels["UUID"], s.labels["kind"]): s.value for s in fams["gpudash_gpu_fault_events"].samples
              if s.name.endswith("_total")}
    assert faults == {("GPU-a", "xid"): 1, ("GPU-a", "ecc"): 0, ("GPU-a", "lost"): 0}
    assert fams["gpudash_gpu_last_xid"].samples[0].value == 79
    ttft = {(s.name, s.labels.get("le")): s.value for s in fams["gpudash_server_probe_ttft_seconds"].samples
            if s.labels["cache"] == "slot"}
    assert ttft[("gpudash_server_probe_ttft_seconds_bucket", "0.25")] == 0
    assert ttft[("gpudash_server_probe_ttft_seconds_bucket", "0.5")] == 1
    assert ttft[("gpudash_server_probe_ttft_seconds_count", None)] == 1
    # counters of PCIe wire bytes and replays beside the rate gauges, and one 0/1 series per clock-event reason
    for name, value in (("gpudash_gpu_pcie_tx_bytes", 2**40), ("gpudash_gpu_pcie_rx_bytes", 3),
                        ("gpudash_gpu_pcie_replay_errors", 7)):
        assert fams[name].type == "counter" and fams[name].samples[0].value == value, name
    assert "wire bytes" in fams["gpudash_gpu_pcie_tx_bytes"].documentation
    events = {s.labels["reason"]: s.value for s in fams["gpudash_gpu_clock_event_active"].samples}
    assert events == {"gpu_idle": 0, "applications_clocks_setting": 0, "sw_power_cap": 1, "hw_slowdown": 0,
                      "sync_boost": 0, "sw_thermal_slowdown": 0, "hw_thermal_slowdown": 1,
                      "hw_power_brake_slowdown": 0, "display_clock_setting": 0}

def test_scrape_serves_each_pools_slab_and_unassigned_bytes() -> None:
    """A real pool on the sim engine, sampled by PoolSource: one series per pool beside its shards' series."""
    eng = TransferEngine(EngineConfig(backend="sim", profile="h200"))
    pool = MemoryPool(4 << 20, engine=eng, gpu=0, shards={"kv": 3 << 20})
    sampler = Sampler([PoolSource([pool])], interval_s=1.0, source_label="sim:h200")
    sink = PrometheusSink("127.0.0.1", 0, settings=ALL)
    try:
        sink(sampler.poll_once())
        text = httpx.get(f"http://127.0.0.1:{sink._server.server_address[1]}/metrics").text
    finally:
        sink.close()
        sampler.stop()
        pool.close()
        eng.close()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    labels = {"pool": "sim-gpu0", "source": "sim:h200"}
    assert [(s.labels, s.value) for s in fams["gpudash_pool_slab_bytes"].samples] == [(labels, 4 << 20)]
    assert [(s.labels, s.value) for s in fams["gpudash_pool_unassigned_bytes"].samples] == [(labels, 1 << 20)]
    assert fams["gpudash_pool_shard_capacity_bytes"].samples[0].value == 3 << 20
