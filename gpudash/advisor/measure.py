"""CuPy measurements on a real GPU: memory bandwidth, matmul rate, one layer's compute time.

CuPy is an optional dependency, imported on first use (this module imports without it); callers turn
the ImportError into a sentence saying how to install it. Times come from CUDA events on the GPU, best (or median) of a few
repeats after a warm-up, so Python overhead and first-call costs (cuBLAS handles, JIT) stay out.
"""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Callable
from typing import Any

from gpudash.advisor.overlap import LayerShape

BW_BYTES = 512 * 2**20
MATMUL_N = 8192
REPEATS = 5


def cupy() -> Any:
    """The cupy module (ImportError when it is not installed)."""
    return importlib.import_module("cupy")


def time_s(fn: Callable[[], object], repeats: int = REPEATS, stream: Any = None) -> list[float]:
    """Seconds each of `repeats` calls of `fn` took on the GPU (after one warm-up call)."""
    cp = cupy()
    stream = stream or cp.cuda.get_current_stream()
    with stream:
        fn()
        out = []
        for _ in range(repeats):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            out.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return out


def memory_bandwidth_gbps(gpu: int, nbytes: int = BW_BYTES) -> float:
    """Device-to-device copy rate counting read + write, GB/s (what a decode step's weight reads see)."""
    cp = cupy()
    with cp.cuda.Device(gpu):
        src = cp.ones(nbytes, dtype=cp.uint8)
        dst = cp.empty_like(src)
        best = min(time_s(lambda: dst.data.copy_from_device_async(src.data, nbytes)))
        return 2 * nbytes / best / 1e9


def matmul_tflops(gpu: int, n: int = MATMUL_N) -> float:
    """Dense fp16 matmul rate (n x n x n), TFLOPS."""
    cp = cupy()
    with cp.cuda.Device(gpu):
        a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        best = min(time_s(lambda: a @ b))
        return 2 * n**3 / best / 1e12


def layer_operands(shape: LayerShape) -> list[tuple[Any, Any]]:
    """fp16 activations and weights (CuPy arrays) for the layer's matmuls, on the current device."""
    cp = cupy()
    ops = []
    for m, k, n in shape.matmuls():
        ops.append((cp.ones((m, k), dtype=cp.float16), cp.full((k, n), 0.001, dtype=cp.float16)))
    return ops


def run_layer(ops: list[tuple[Any, Any]]) -> None:
    """One forward pass of the layer's matmuls (results discarded)."""
    for x, w in ops:
        x @ w


def layer_time_s(gpu: int, shape: LayerShape, repeats: int = 10) -> float:
    """Median T_compute of one layer's matmuls on `gpu`, seconds."""
    cp = cupy()
    with cp.cuda.Device(gpu):
        ops = layer_operands(shape)
        return statistics.median(time_s(lambda: run_layer(ops), repeats))


def peer_copy(src: int, dst: int, nbytes: int = 64 * 2**20, small: int = 4096) -> tuple[float, float]:
    """(GB/s, latency us) of copies GPU `src` -> GPU `dst`: P2P where the pair supports it, else the
    driver stages them through host memory, which is what an all-reduce between them would do too."""
    cp = cupy()
    with cp.cuda.Device(src):
        a = cp.ones(nbytes, dtype=cp.uint8)
    with cp.cuda.Device(dst):
        b = cp.empty(nbytes, dtype=cp.uint8)
        big = min(time_s(lambda: b.data.copy_from_device_async(a.data, nbytes)))
        tiny = min(time_s(lambda: b.data.copy_from_device_async(a.data, small)))
    return nbytes / big / 1e9, tiny * 1e6
