"""Compute/communication overlap arithmetic for one transformer layer (the "defer by one layer" idea).

T_compute is a layer's matmul time on one GPU: measured with CuPy on a real GPU, or the roofline
estimate here (the larger of FLOPs / matmul rate and weight bytes / memory bandwidth) on a sim rig.
T_comm is what the layer must move: with tensor parallelism its two all-reduces (ring: each GPU sends
2(N-1)/N of the activations in 2(N-1) latency-bound steps); on one GPU its weights streamed over the
host link (offload/prefetch). Deferring communication by one layer hides it when T_comm < T_compute;
deferring by `depth` layers hides it when T_comm < depth * T_compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One dense transformer layer (MHA attention q/k/v/o + gated MLP) as one GPU of `tp` sees it."""

    hidden: int
    ffn: int
    tokens: int
    tp: int = 1
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn", "tokens", "tp", "dtype_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.tp or self.ffn % self.tp:
            raise ValueError(f"hidden ({self.hidden}) and ffn ({self.ffn}) must divide by tp ({self.tp})")

    @property
    def params(self) -> int:
        """Weights of the whole layer: q, k, v, o (4 h^2) and gate, up, down (3 h f)."""
        return 4 * self.hidden * self.hidden + 3 * self.hidden * self.ffn

    @property
    def weight_bytes(self) -> int:
        """Weight bytes one GPU holds (and reads once per forward pass)."""
        return self.params * self.dtype_bytes // self.tp

    @property
    def flops(self) -> int:
        """Matmul FLOPs one GPU does for `tokens` tokens (2 per multiply-add)."""
        return 2 * self.tokens * self.params // self.tp

    @property
    def allreduce_bytes(self) -> int:
        """Payload of one of the layer's two all-reduces (the activations, tokens x hidden)."""
        return self.tokens * self.hidden * self.dtype_bytes

    def matmuls(self) -> tuple[tuple[int, int, int], ...]:
        """(m, k, n) of the layer's matmuls on one GPU: qkv, o, gate+up, down."""
        h, f, t, n = self.hidden, self.ffn, self.tokens, self.tp
        return ((t, h, 3 * h // n), (t, h // n, h), (t, h, 2 * f // n), (t, f // n, h))


def compute_time_s(shape: LayerShape, mem_bw_gbps: float, matmul_tflops: float) -> float:
    """Roofline T_compute: the layer is bound by reading its weights or by its FLOPs, whichever is slower."""
    return max(shape.weight_bytes / (mem_bw_gbps * 1e9), shape.flops / (matmul_tflops * 1e12))


def comm_time_s(shape: LayerShape, link_gbps: float, latency_us: float) -> float:
    """T_comm: two ring all-reduces when tp > 1, else the layer's weights over the host link."""
    if shape.tp == 1:
        return latency_us * 1e-6 + shape.weight_bytes / (link_gbps * 1e9)
    n = shape.tp
    steps = 2 * (n - 1)
    one = steps * latency_us * 1e-6 + (2 * (n - 1) / n) * shape.allreduce_bytes / (link_gbps * 1e9)
    return 2 * one


@dataclass(frozen=True, slots=True)
class Overlap:
    """What deferring communication does for one layer on one GPU."""

    t_compute_s: float
    t_comm_s: float
    hides: bool  # deferring by one layer hides T_comm
    depth: int  # layers to defer by so that T_comm < depth * T_compute
    t_serial_s: float  # compute, then wait for communication
    t_overlapped_s: float  # communication behind compute
    bw_util_serial: float  # weight bytes read / (t_serial * memory bandwidth)
    bw_util_overlapped: float


def analyse(t_compute_s: float, t_comm_s: float, weight_bytes: int, mem_bw_gbps: float) -> Overlap:
    """Hides / depth / effective memory-bandwidth utilisation from the two times of one layer."""
    if t_compute_s <= 0 or t_comm_s < 0 or mem_bw_gbps <= 0:
        raise ValueError("t_compute must be > 0, t_comm >= 0 and the memory bandwidth > 0")
    depth = math.floor(t_comm_s / t_compute_s) + 1
    serial = t_compute_s + t_comm_s
    overlapped = max(t_compute_s, t_comm_s)
    bw = mem_bw_gbps * 1e9
    return Overlap(
        t_compute_s=t_compute_s,
        t_comm_s=t_comm_s,
        hides=t_comm_s < t_compute_s,
        depth=depth,
        t_serial_s=serial,
        t_overlapped_s=overlapped,
        bw_util_serial=weight_bytes / (serial * bw),
        bw_util_overlapped=weight_bytes / (overlapped * bw),
    )
