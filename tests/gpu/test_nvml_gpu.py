"""nvml.py against `nvidia-smi --query-gpu` on a real GPU, sweep cost, and the PCIe counter calibration
against a CuPy copy. Run on the GPU machine: ``pytest tests/gpu/test_nvml_gpu.py -m gpu -s``."""

from __future__ import annotations

import csv
import ctypes
import shutil
import statistics
import subprocess
import threading
import time

import pytest

from gpudash.gpu import nvml
from gpudash.telemetry.nvml import NvmlSource
from gpudash.telemetry.rig import read_topology

pytestmark = pytest.mark.gpu
MiB = 2**20
QUERY = ("index,name,uuid,memory.total,memory.used,pcie.link.gen.max,pcie.link.width.max,"
         "pcie.link.gen.current,pcie.link.width.current,power.draw,temperature.gpu")


def smi() -> list[dict[str, str]]:
    """nvidia-smi's view of every GPU, one dict per GPU keyed by the query field names."""
    exe = shutil.which("nvidia-smi")
    assert exe, "nvidia-smi is not on PATH on this GPU machine"
    out = subprocess.run([exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    keys = QUERY.split(",")
    return [dict(zip(keys, (c.strip() for c in row))) for row in csv.reader(out.splitlines()) if row]


@pytest.fixture(scope="module")
def source():
    assert nvml.driver_available() is None
    src = NvmlSource()
    yield src
    src.close()


def test_static_fields_match_nvidia_smi(source: NvmlSource) -> None:
    rows = smi()
    gpus = source.poll()["gpus"]
    assert len(gpus) == len(rows) >= 1
    for g, row in zip(gpus, rows):
        assert g.index == int(row["index"])
        assert g.name == row["name"] and g.uuid == row["uuid"]
        assert abs(g.mem_total / MiB - float(row["memory.total"])) <= 1
        assert g.link_gen_max == int(row["pcie.link.gen.max"])
        assert g.link_width_max == int(row["pcie.link.width.max"])
        assert g.bar1_total and g.bar1_total > 0


def test_dynamic_fields_within_tolerance(source: NvmlSource) -> None:
    """Idle GPUs retrain their link and move their power between reads, so nvidia-smi is asked just
    before and just after the sweep and our value must match one of them (within tolerance)."""
    before = smi()
    gpus = source.poll()["gpus"]
    after = smi()
    for g, b, a in zip(gpus, before, after):
        assert any(abs(g.mem_used / MiB - float(r["memory.used"])) <= 256 for r in (b, a))
        assert g.link_gen in {int(r["pcie.link.gen.current"]) for r in (b, a)}
        assert g.link_width in {int(r["pcie.link.width.current"]) for r in (b, a)}
        smi_power = [float(r["power.draw"]) for r in (b, a)]
        assert any(abs(g.power_w - p) <= max(15.0, 0.15 * p) for p in smi_power), (g.power_w, smi_power)
        assert any(abs(g.temp_c - float(r["temperature.gpu"])) <= 3 for r in (b, a))
        assert 0 <= g.util_pct <= 100 and g.sm_clock_mhz > 0


def test_sweep_cost_is_printed(source: NvmlSource) -> None:
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        out = source.poll()
        times.append(time.perf_counter() - t0)
    assert len(out["gpus"]) >= 1
    print(f"\nNVML sweep of {len(out['gpus'])} GPU(s): median {statistics.median(times) * 1e3:.3f} ms, "
          f"max {max(times) * 1e3:.3f} ms (target <= 3 ms per H200); counter GPUs {source.counter_gpus}, "
          f"poller interval {source.counters.interval_s * 1e3:.1f} ms")


def test_topology_facts(source: NvmlSource) -> None:
    facts = read_topology("nvml")
    n = len(facts.gpus)
    assert n == len(source.devices) and not facts.is_sim
    assert all(facts.p2p[i][i] == "X" for i in range(n))
    assert all(c in {"X", "OK", "NS", "GNS", "CNS", "TNS", "U"} for row in facts.p2p for c in row)
    for g in facts.gpus:
        assert 0 < g.memory_free <= g.memory_total and g.compute_capability >= (7, 0)
    print(f"\np2p {facts.p2p} nvlink {facts.nvlink} numa {[g.numa_node for g in facts.gpus]}")


def test_pcie_counter_calibration_and_live_rate(source: NvmlSource) -> None:
    cupy = pytest.importorskip("cupy", reason="the PCIe calibration copies with CuPy (cupy-cuda13x on the H200)")
    from gpudash.telemetry.pcie_calibration import calibrate

    if 0 not in source.counter_gpus:
        pytest.fail("GPU 0 has no PCIe counter fields: gpudash falls back to nvmlDeviceGetPcieThroughput; "
                    "record this in the report")
    cal = calibrate(0)
    print(f"\ncalibration: payload {cal.payload_bytes} B each way; RX x{cal.rx_overhead:.4f} "
          f"TX x{cal.tx_overhead:.4f}; H2D {cal.h2d_gbps:.1f} GB/s, D2H {cal.d2h_gbps:.1f} GB/s")
    assert cal.trusted, "counter deltas are not within 1.0-1.35x of the payload: the unit is not bytes"

    # The live source, told the measured overhead, reports the payload rate of a sustained H2D copy.
    live = NvmlSource(wire_overhead={0: cal.wire_overhead})
    stop = threading.Event()
    moved = [0, 0.0]

    def copy_loop() -> None:
        n = 256 * MiB
        host = cupy.cuda.alloc_pinned_memory(n)
        host_ptr = ctypes.c_void_p(host.ptr)
        buf = cupy.empty(n, dtype=cupy.uint8)
        t0 = time.perf_counter()
        while not stop.is_set():
            buf.data.copy_from_host(host_ptr, n)
            moved[0] += n
        moved[1] = time.perf_counter() - t0

    try:
        live.poll()
        worker = threading.Thread(target=copy_loop)
        worker.start()
        time.sleep(0.5)
        live.poll()
        time.sleep(1.0)
        rx = live.poll()["gpus"][0].pcie_rx_bps
        stop.set()
        worker.join()
    finally:
        live.close()
    copied = moved[0] / moved[1]
    print(f"live: copy loop {copied / 1e9:.1f} GB/s payload, NVML source said {rx / 1e9:.1f} GB/s; "
          f"poller interval {live.counters.interval_s * 1e3:.1f} ms")
    assert abs(rx - copied) / copied < 0.15


def test_xid_events_are_watched_where_the_driver_allows(source: NvmlSource) -> None:
    """The real driver either registers each GPU for Xid events (and an empty set drains in one cheap
    call, no fault being queued on a healthy box) or says in one note why not."""
    from gpudash.gpu.xid import XidWatcher

    watcher = XidWatcher({d.index: d.handle for d in source.devices})  # the source's own notes are taken by its polls
    notes = watcher.take_notes()
    print(f"\nXid events watched per GPU: { {i: hex(m) for i, m in watcher.watching.items()} }; notes: {notes}")
    assert watcher.watching or notes
    cpu = []
    for _ in range(200):
        c0 = time.thread_time()
        assert watcher.poll(time.time()) == ()
        cpu.append(time.thread_time() - c0)
    watcher.close()
    print(f"draining the empty event set: median {statistics.median(cpu) * 1e6:.1f} us of CPU")
