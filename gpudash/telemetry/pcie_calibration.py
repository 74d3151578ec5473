"""Check the PCIe counter unit against a known transfer before trusting it.

Copies a known number of payload bytes host->device and device->host with CuPy (pinned memory, in
chunks small enough that the 32-bit counters cannot wrap twice between reads) and compares the
counters' deltas: the ratio is the wire overhead (wire bytes per payload byte; ~1.08-1.10 on PCIe
with 256-byte TLPs). A ratio far from that means the unit is not bytes and the counters are not used.

Run it once per box: ``python -m gpudash.telemetry.pcie_calibration [--gpu N]``. It runs in its own
process so the CUDA context it needs is gone when it ends; the result is cached per GPU UUID in the
user cache directory, where `NvmlSource` picks it up.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import click

from gpudash.gpu import nvml
from gpudash.gpu.device import Device
from gpudash.telemetry.pcie_cache import PLAUSIBLE_OVERHEAD, Calibration, save
from gpudash.telemetry.pcie_counters import CounterUnwrapper

MiB = 2**20


def calibrate(gpu: int = 0, chunk_bytes: int = 64 * MiB, chunks: int = 16) -> Calibration:
    """Measure the counter unit on GPU `gpu`; RuntimeError when CuPy or the counter fields are missing."""
    try:
        import cupy
    except ImportError:
        raise RuntimeError("PCIe calibration needs CuPy; install gpudash[cuda] (cupy-cuda12x) or "
                           "the cupy wheel matching your CUDA") from None
    reason = nvml.driver_available()
    if reason is not None:
        raise RuntimeError(f"PCIe calibration needs NVML: {reason}")
    dev = Device(gpu)
    if dev.pcie_counters() is None:
        raise RuntimeError(f"GPU {gpu} has no PCIe byte-counter fields; gpudash uses nvmlDeviceGetPcieThroughput there")
    tx, rx = CounterUnwrapper(), CounterUnwrapper()

    def read() -> tuple[int, int]:
        raw = dev.pcie_counters()
        if raw is None:
            raise RuntimeError(f"GPU {gpu}: PCIe counter read failed during calibration")
        return tx.update(raw[0]), rx.update(raw[1])

    def settle() -> tuple[int, int]:
        time.sleep(0.1)  # let the driver publish the last counter update
        return read()

    with cupy.cuda.Device(_cuda_index(cupy, dev.static.pci_bus_id, gpu)):
        host = cupy.cuda.alloc_pinned_memory(chunk_bytes)
        host_ptr = ctypes.c_void_p(host.ptr)  # older CuPy takes only a c_void_p here
        buf = cupy.empty(chunk_bytes, dtype=cupy.uint8)
        buf.data.copy_from_host(host_ptr, chunk_bytes)  # warm up both directions
        buf.data.copy_to_host(host_ptr, chunk_bytes)

        def timed(copy: Any) -> float:
            """Seconds for `chunks` copies, reading the counters after each so none can wrap twice."""
            t0 = time.perf_counter()
            for _ in range(chunks):
                copy(host_ptr, chunk_bytes)
                read()
            return time.perf_counter() - t0

        _, rx0 = settle()
        h2d_s = timed(buf.data.copy_from_host)
        tx0, rx1 = settle()
        d2h_s = timed(buf.data.copy_to_host)
        tx1, _ = settle()
    payload = chunk_bytes * chunks
    return Calibration(uuid=dev.static.uuid, payload_bytes=payload, rx_counted=rx1 - rx0, tx_counted=tx1 - tx0,
                       h2d_gbps=payload / h2d_s / 1e9, d2h_gbps=payload / d2h_s / 1e9)


def _cuda_index(cupy: Any, bus_id: str, fallback: int) -> int:
    """CUDA's device index for an NVML bus id (CUDA may order devices differently from NVML)."""
    try:
        for i in range(cupy.cuda.runtime.getDeviceCount()):
            if cupy.cuda.Device(i).pci_bus_id.lower()[-12:] == bus_id.lower()[-12:]:
                return i
    except AttributeError:  # a CuPy without Device.pci_bus_id: trust NVML's order
        pass
    return fallback


@click.command(name="python -m gpudash.telemetry.pcie_calibration")
@click.option("--gpu", type=int, default=0, show_default=True, help="NVML index of the GPU to calibrate.")
def main(gpu: int) -> None:
    """Measure the PCIe byte counters' unit against a known copy and cache the result."""
    try:
        cal = calibrate(gpu)
    except RuntimeError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"GPU {gpu} {cal.uuid}: {cal.payload_bytes / 1e9:.2f} GB each way; counters saw "
               f"RX x{cal.rx_overhead:.3f} (H2D {cal.h2d_gbps:.1f} GB/s), TX x{cal.tx_overhead:.3f} "
               f"(D2H {cal.d2h_gbps:.1f} GB/s)")
    if not cal.trusted:
        raise click.ClickException(f"ratios outside {PLAUSIBLE_OVERHEAD}: the counter unit is not bytes; not saved")
    click.echo(f"saved wire overhead {cal.wire_overhead:.3f} to {save(cal)}")


if __name__ == "__main__":
    main()
