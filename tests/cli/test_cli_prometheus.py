"""The Prometheus sink: address parsing, NA values left out, sim labels on every series (real HTTP scrape)."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.engine import EngineConfig, TransferEngine
from gpudash.engine.pools import MemoryPool
from gpudash.records import GpuSample, HostSample, Snapshot
from gpudash.telemetry.pools import PoolSource
from gpudash.telemetry.prometheus import PrometheusSink, parse_listen
from gpudash.telemetry.sampler import Sampler


@pytest.mark.parametrize("text, want", [("9400", ("127.0.0.1", 9400)), ("0.0.0.0:9401", ("0.0.0.0", 9401)),
                                         ("[::1]:80", ("::1", 80)), ("box.lan:65535", ("box.lan", 65535))])
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["", "x", "host:", ":9", "0", "70000", "a:b"])
def test_parse_listen_refuses_with_the_expected_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"expects \[HOST:\]PORT with a port from 1 to 65535"):
        parse_listen(text)


def test_scrape_serves_the_latest_snapshot_and_leaves_na_out() -> None:
    sink = PrometheusSink("127.0.0.1", 0)
    port = sink._server.server_address[1]
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").text == ""  # nothing sampled yet
        gpu = GpuSample(1.0, 0, "GPU-a", "NVIDIA H200", util_pct=40.0, pcie_rx_bps=3e9, power_w=None)
        sink(Snapshot(1.0, 0, "sim:h200", gpus=(gpu,), host=HostSample(1.0, cpu_pct=7.0)))
        sink(Snapshot(2.0, 1, "sim:h200", gpus=(dataclasses.replace(gpu, ts=2.0, util_pct=55.0),)))
        fams = {f.name: f for f in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics").text)}
    finally:
        sink.close()
    (util,) = fams["gpudash_gpu_utilization_percent"].samples
    assert util.value == 55.0 and util.labels == {"gpu": "0", "uuid": "GPU-a", "name": "NVIDIA H200", "source": "sim:h200"}
    assert fams["gpudash_gpu_pcie_rx_bytes_per_second"].samples[0].value == 3e9
    assert "gpudash_gpu_power_watts" not in fams  # NA is absent, never a made-up 0
    assert "gpudash_host_cpu_percent" not in fams  # the newest tick had no host sample
    assert fams["gpudash_tick"].samples[0].value == 1


def test_scrape_serves_each_pools_slab_and_unassigned_bytes() -> None:
    """A real pool on the sim engine, sampled by PoolSource: one series per pool beside its shards' series."""
    eng = TransferEngine(EngineConfig(backend="sim", profile="h200"))
    pool = MemoryPool(4 << 20, engine=eng, gpu=0, shards={"kv": 3 << 20})
    sampler = Sampler([PoolSource([pool])], interval_s=1.0, source_label="sim:h200")
    sink = PrometheusSink("127.0.0.1", 0)
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
