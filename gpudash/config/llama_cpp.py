"""llama.cpp's own [[servers]] fields (llama-server's flags), checked when the config is read. What gpudash
does with them (command line, metrics, budget) is the llama.cpp kind, gpudash/launcher/kinds/llama_cpp.py."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from gpudash.config.servers import ServerSpec


def split_problem(name: str, ratios: Sequence[float], gpus: Sequence[int]) -> str | None:
    """The one rule for a split's ratio count: one ratio per GPU the server runs on (config load, launch,
    the control layer and the split form all ask this)."""
    n = len(gpus)
    if len(ratios) != n:
        s = "s" if n != 1 else ""
        return f"{name} runs on {n} GPU{s} ({','.join(map(str, gpus))}): give {n} ratio{s}, not {len(ratios)}"
    return None


class LlamaCppSpec(ServerSpec):
    """A llama-server entry: ServerSpec plus llama.cpp's own flags."""

    kind: Literal["llama.cpp"] = Field(  # type: ignore[assignment]
        "llama.cpp", description=ServerSpec.model_fields["kind"].description)

    split_mode: Literal["none", "layer", "row", "tensor"] | None = None
    """llama.cpp -sm: how a model is split across GPUs."""

    tensor_split: list[float] | None = None
    """llama.cpp -ts: proportion of the model each GPU holds, e.g. [2, 3]."""

    n_gpu_layers: int | Literal["all", "auto"] | None = None
    """llama.cpp -ngl: layers offloaded to GPUs: a number, "all", or "auto" (llama-server fits what the
    memory holds). Current llama-server reads -1 as "auto" and -2 as "all"; builds older than the
    "auto"/"all" words read any number above the layer count as all."""

    ctx_size: int | None = Field(None, ge=0)
    """llama.cpp -c: context size in tokens."""

    parallel: int | None = Field(None, ge=1)
    """llama.cpp -np: parallel decoding slots."""

    cache_type_k: str | None = None
    """llama.cpp -ctk: KV cache type for K (f16, q8_0, ...)."""

    cache_type_v: str | None = None
    """llama.cpp -ctv: KV cache type for V."""

    draft_model: str | None = None
    """llama.cpp -md: draft model for speculative decoding."""

    draft_max: int | None = Field(None, ge=1)
    """llama.cpp --draft-max: tokens drafted per step."""

    draft_min: int | None = Field(None, ge=0)
    """llama.cpp --draft-min: minimum draft tokens."""

    flash_attn: Literal["on", "off", "auto"] | None = None
    """llama.cpp -fa: Flash Attention on, off or auto (llama-server's default is auto)."""

    cache_reuse: int | None = Field(None, ge=0)
    """llama.cpp --cache-reuse: smallest chunk, in tokens, reused from the KV cache by shifting (0: off)."""

    cache_ram_mib: int | None = Field(None, ge=-1)
    """llama.cpp --cache-ram: host-memory prompt cache in MiB (-1: no limit, 0: off)."""

    fit: Literal["on", "off"] | None = None
    """llama.cpp --fit: let llama-server shrink unset layers/context to fit device memory. gpudash sets
    -ngl and -c itself when a `share` is given, which leaves --fit nothing to change."""

    @model_validator(mode="after")
    def _llama_fields(self) -> LlamaCppSpec:
        ts = self.tensor_split
        if ts is not None and (not ts or not all(math.isfinite(x) and x >= 0 for x in ts) or sum(ts) <= 0):
            raise ValueError("tensor_split must be non-negative, finite numbers with a positive sum, e.g. [2, 3]")
        if ts is not None and self.gpus and (problem := split_problem(self.name, ts, self.gpus)):
            raise ValueError(f"tensor_split: {problem}")
        if isinstance(self.n_gpu_layers, int) and self.n_gpu_layers < -2:
            raise ValueError(f"n_gpu_layers {self.n_gpu_layers} is not a layer count; use a number >= 0, "
                             f"\"all\" or \"auto\"")
        return self

    def split_ratios(self) -> list[float] | None:
        return self.tensor_split

    def split_problem(self, ratios: Sequence[float], gpus: Sequence[int]) -> str | None:
        return split_problem(self.name, ratios, gpus)

    def with_split(self, ratios: Sequence[float]) -> dict[str, Any]:
        return {"tensor_split": [float(r) for r in ratios]}
