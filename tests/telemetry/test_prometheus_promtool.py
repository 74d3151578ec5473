"""`promtool check metrics` (Prometheus' own linter, Debian's prometheus package) on a live /metrics: its only
allowed findings are the camelCase label names copied from dcgm-exporter so that `on(UUID)` joins work (UUID,
Hostname, modelName). The same text with those three renamed must lint clean, so any other finding fails."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpudash.config import PrometheusConfig
from gpudash.records import (EnginePathSample, Event, GpuSample, HostSample, PoolSample, PoolShardSample,
                             RequestSample, ServerSample, Snapshot)
from gpudash.telemetry.prometheus import PrometheusSink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_helpers import start  # noqa: E402
from fleet_helpers import binary, wait_for  # noqa: E402
from gpudash.launcher.health import free_port  # noqa: E402

DCGM_LABELS = {"UUID": "uuid", "Hostname": "hostname", "modelName": "model_name"}
CAMEL = "label names should be written in 'snake_case' not 'camelCase'"


def lint(text: str) -> tuple[int, list[str]]:
    """promtool's exit status and findings (one line each) for an exposition read from stdin."""
    p = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    return p.returncode, [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]


def snake_dcgm_labels(text: str) -> str:
    """The exposition with dcgm-exporter's three camelCase label names in snake_case (values untouched)."""
    return re.sub(r"([{,])(UUID|Hostname|modelName)=", lambda m: m[1] + DCGM_LABELS[m[2]] + "=", text)


def assert_only_dcgm_labels_found(text: str) -> None:
    assert any(f.name.startswith("gpudash_gpu_") for f in text_string_to_metric_families(text)), text[:500]
    _, findings = lint(text)
    assert findings and all(line.endswith(CAMEL) for line in findings), findings
    rc, rest = lint(snake_dcgm_labels(text))
    assert (rc, rest) == (0, []), rest


def test_every_family_of_a_full_snapshot_lints_clean_but_for_dcgm_exporters_labels() -> None:
    """Every record kind the exposition turns into series, with servers and GPUs at "all"."""
    gpu = GpuSample(1.0, 0, "GPU-a", "NVIDIA H200", util_pct=40.0, mem_used=1, mem_total=2, power_w=100.0, temp_c=50.0,
                    sm_clock_mhz=1980, pcie_tx_bps=1.0, pcie_rx_bps=2.0, link_gen=5, link_width=16, link_gen_max=5,
                    link_width_max=16, bar1_total=4, bar1_used=1, ecc_uncorrected=0, remapped_rows=0,
                    pcie_tx_wire_bytes=5, pcie_rx_wire_bytes=6, pcie_replay_errors=0, clock_events=1)
    server = ServerSample(1.0, "chat", "vllm", "ready", tokens_per_s=5.0, kv_cache_usage=0.5, prefix_cache_queries=10.0,
                          prefix_cache_hits=5.0, restarts=1, kv_cache_usage_engines=(0.5, 0.25),
                          ttft_buckets=(("0.1", 1), ("+Inf", 2)), ttft_sum_s=0.7, ttft_count=2)
    failed = RequestSample(0.0, "chat", None, None, None, None, ok=False, error='HTTP 500 "boom"\nsecond line')
    snap = Snapshot(10.0, 0, "sim:h200", gpus=(gpu,), host=HostSample(1.0, cpu_pct=7.0, mem_used=1, mem_total=2),
                    engine_paths=(EnginePathSample(1.0, "direct:0", 0, None, "h2d", 10, 1, 0, 1.0, 0.1),),
                    pools=(PoolSample(1.0, "p", 4, 1),),
                    pool_shards=(PoolShardSample(1.0, "p", "kv", 3, 1, 2, 2, 1, 0.0, 0),),
                    servers=(server,), requests=(RequestSample(0.0, "chat", ttft_s=0.3, total_s=0.5, prompt_tokens=100,
                                                               cached_tokens=90), failed),
                    events=(Event(1.0, "driver", "gpu.xid", "GPU0", new=79, ok=False),))
    sink = PrometheusSink("127.0.0.1", 0, settings=PrometheusConfig(gpu="all", servers="all"))
    try:
        sink(snap)
        sink(Snapshot(100.0, 1, "sim:h200", gpus=(gpu,), servers=(server,)))  # the probe's TTFT settles
        text = httpx.get(f"http://127.0.0.1:{sink.port}/metrics", trust_env=False).text
    finally:
        sink.close()
    assert "gpudash_server_probe_ttft_seconds_bucket" in text and "gpudash_server_ttft_seconds_bucket" in text
    assert_only_dcgm_labels_found(text)


def test_a_live_recorder_lints_clean_but_for_dcgm_exporters_labels(tmp_path: Path) -> None:
    """`gpudash record --prometheus` on a sim rig, scraped as Prometheus would."""
    port = free_port()
    proc = start(tmp_path, "record", "--sim", "rtx5080+rtx3090", "--interval", "0.2", "--db",
                 str(tmp_path / "p.db"), "--prometheus", str(port), "--quiet", "--duration", "60")
    try:
        def scraped() -> str | None:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False).text
            except httpx.TransportError:
                return None
            return text if "gpudash_gpu_pcie_tx_bytes_total" in text else None

        text = wait_for(scraped, 60, "the recorder's first tick served")
        assert_only_dcgm_labels_found(text)
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        for name in ("gpudash_gpu_pcie_tx_bytes", "gpudash_gpu_pcie_rx_bytes", "gpudash_gpu_pcie_replay_errors",
                     "gpudash_gpu_clock_event_active"):  # the sim's figures, labelled as every sim series
            assert {s.labels["source"] for s in fams[name].samples} == {"sim:rtx5080+rtx3090"}, name
        assert {s.labels["gpu"] for s in fams["gpudash_gpu_clock_event_active"].samples} == {"0", "1"}
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0


def test_any_other_finding_fails_the_check() -> None:
    """The check is not vacuous: a gauge ending in _total beside a dcgm-labelled series is a finding it reports."""
    ok = '# HELP gpudash_gpu_x_ratio x\n# TYPE gpudash_gpu_x_ratio gauge\ngpudash_gpu_x_ratio{modelName="H200"} 1\n'
    assert_only_dcgm_labels_found(ok)
    bad = ok + "# HELP gpudash_y_total y\n# TYPE gpudash_y_total gauge\ngpudash_y_total 1\n"
    try:
        assert_only_dcgm_labels_found(bad)
    except AssertionError as err:
        assert "should not have \"_total\" suffix" in str(err)
    else:
        raise AssertionError("a gauge named _total passed the check")
