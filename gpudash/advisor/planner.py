"""The llama.cpp `-ts` split planner: how much of a model each GPU should hold.

Balancing memory gives every GPU the same fraction of its free memory (16 GB + 24 GB -> 2:3, the
split operators land on by hand). Balancing time gives every GPU a share proportional to how fast it
gets through a byte of weights per decoded token (memory bandwidth plus matmul rate), because each
token waits for the slowest GPU; a GPU whose share would not fit is capped at its free memory and the
rest goes to the others (so when memory binds, time balance converges to memory balance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

GB = 10**9
# Memory a GPU keeps for the CUDA context, cuBLAS workspace and compute buffers beside the weights/KV.
DEFAULT_RESERVE_BYTES = 512 * 2**20

Balance = Literal["memory", "time"]


class PlanError(ValueError):
    """The model cannot be placed; the message is one sentence saying why and what to change."""


@dataclass(frozen=True, slots=True)
class GpuBudget:
    """What the planner knows about one GPU."""

    index: int
    name: str
    free_bytes: int
    mem_bw_gbps: float | None = None
    matmul_tflops: float | None = None
    rates_source: str = ""  # "measured (CuPy)" | "sim profile" | ""


@dataclass(frozen=True, slots=True)
class GpuShare:
    """One GPU's part of a plan."""

    index: int
    name: str
    ratio: float
    assigned_bytes: int
    usable_bytes: int
    token_time_s: float | None  # this GPU's time per decoded token for its share, when rates are known

    @property
    def fill(self) -> float:
        """Fraction of its usable memory this GPU ends up holding."""
        return self.assigned_bytes / self.usable_bytes if self.usable_bytes else 0.0


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """A proposed `-ts` split and why."""

    balance: Balance
    need_bytes: int
    shares: tuple[GpuShare, ...]
    ts: str  # the llama.cpp argument, e.g. "2,3"
    capped: tuple[int, ...]  # GPUs whose share was cut to fit their memory (time balance)
    reason: str

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(s.ratio for s in self.shares)


def ts_argument(ratios: Sequence[float], tolerance: float = 0.01) -> str:
    """The shortest integer ratio within `tolerance` of each share (e.g. 0.397/0.603 -> "2,3")."""
    n = len(ratios)
    for total in range(1, 20 * n + 1):
        ints = [round(r * total) for r in ratios]
        if (sum(ints) and all(i > 0 or r == 0 for i, r in zip(ints, ratios))
                and all(abs(i / sum(ints) - r) <= tolerance for i, r in zip(ints, ratios))):
            g = math.gcd(*ints)
            return ",".join(str(i // g) for i in ints)
    pct = [max(1, round(r * 100)) if r > 0 else 0 for r in ratios]
    g = math.gcd(*pct)
    return ",".join(str(p // g) for p in pct)


def bytes_per_second(gpu: GpuBudget, batch: int, flops_per_byte: float) -> float:
    """How fast a GPU gets through weights for one decode step of `batch` tokens: bytes/s."""
    if gpu.mem_bw_gbps is None or gpu.matmul_tflops is None:
        raise PlanError(f"GPU {gpu.index} has no measured throughput; install CuPy (pip install "
                        "'gpudash[cuda]') to measure it, or plan with --balance memory")
    per_byte_s = 1 / (gpu.mem_bw_gbps * 1e9) + batch * flops_per_byte / (gpu.matmul_tflops * 1e12)
    return 1 / per_byte_s


def _water_fill(weights: list[float], caps: list[int], need: int) -> tuple[list[float], list[int]]:
    """Split `need` proportionally to `weights`, capping each part at `caps`; returns parts and capped indices."""
    parts = [0.0] * len(weights)
    open_ = set(range(len(weights)))
    left = float(need)
    capped: list[int] = []
    while open_:
        w = sum(weights[i] for i in open_)
        over = [i for i in open_ if left * weights[i] / w > caps[i]]
        if not over:
            for i in open_:
                parts[i] = left * weights[i] / w
            break
        for i in over:
            parts[i] = float(caps[i])
            left -= caps[i]
            open_.discard(i)
            capped.append(i)
    return parts, sorted(capped)


def plan_split(gpus: Sequence[GpuBudget], model_bytes: int, kv_bytes: int = 0, balance: Balance = "memory",
               reserve_bytes: int = DEFAULT_RESERVE_BYTES, batch: int = 1,
               flops_per_byte: float = 2.0) -> SplitPlan:
    """Propose the `-ts` split of `model_bytes` weights plus `kv_bytes` KV cache over `gpus`.

    `flops_per_byte` is the matmul work per weight byte per token (2 for 8-bit weights, 1 for 16-bit).
    Raises PlanError with one sentence when nothing fits or the inputs make no sense.
    """
    if not gpus:
        raise PlanError("no GPUs to plan for; run on a machine with NVIDIA GPUs or pass --sim PROFILE")
    if model_bytes <= 0 or kv_bytes < 0:
        raise PlanError("the model size must be positive and the KV cache size not negative (sizes in GB)")
    if balance not in ("memory", "time"):
        raise PlanError(f"balance must be 'memory' or 'time', not {balance!r}")
    need = model_bytes + kv_bytes
    usable = [max(0, g.free_bytes - reserve_bytes) for g in gpus]
    total = sum(usable)
    if need > total:
        raise PlanError(
            f"the model ({model_bytes / GB:.1f} GB) plus KV cache ({kv_bytes / GB:.1f} GB) needs "
            f"{need / GB:.1f} GB but GPUs {','.join(str(g.index) for g in gpus)} have only {total / GB:.1f} GB "
            f"free after {reserve_bytes / 2**20:.0f} MiB each for the CUDA context; use a smaller quantisation, "
            "a shorter context, or more GPUs")
    speeds = ([bytes_per_second(g, batch, flops_per_byte) for g in gpus]
              if balance == "time" or all(g.mem_bw_gbps and g.matmul_tflops for g in gpus) else None)
    if balance == "memory":
        parts, capped = [need * u / total for u in usable], []
    else:
        parts, capped = _water_fill(speeds, usable, need)
    ratios = [p / need for p in parts]
    shares = tuple(
        GpuShare(g.index, g.name, r, round(p), u, (p / s) if speeds else None)
        for g, r, p, u, s in zip(gpus, ratios, parts, usable, speeds or [1.0] * len(gpus)))
    return SplitPlan(balance, need, shares, ts_argument(ratios), tuple(gpus[i].index for i in capped),
                     _reason(balance, gpus, shares, capped, need, total))


def _reason(balance: Balance, gpus: Sequence[GpuBudget], shares: Sequence[GpuShare], capped: list[int],
            need: int, total: int) -> str:
    if len(gpus) == 1:
        return (f"one GPU holds all {need / GB:.1f} GB ({shares[0].fill:.0%} of its usable memory); "
                "no -ts split is needed")
    if balance == "memory":
        return (f"every GPU fills the same {need / total:.0%} of its usable memory, so the split follows "
                "free memory: " + ", ".join(f"GPU {s.index} {s.usable_bytes / GB:.1f} GB" for s in shares))
    rates = ", ".join(f"GPU {g.index} {g.mem_bw_gbps:.0f} GB/s, {g.matmul_tflops:.1f} TFLOPS ({g.rates_source})"
                      for g in gpus)
    text = (f"each token waits for the slowest GPU, so shares follow how fast each GPU reads its weights "
            f"({rates})")
    if capped:
        text += ("; memory binds on GPU " + ", ".join(str(gpus[i].index) for i in capped)
                 + ", which is filled to its usable memory, and the rest goes to the others")
    return text
