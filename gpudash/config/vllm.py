"""vLLM's own [[servers]] fields (`vllm serve` flags), checked when the config is read. What gpudash does with
them (command line, metrics, sleep mode) is the vLLM kind, gpudash/launcher/kinds/vllm.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpudash.config.servers import ServerSpec

# vLLM's own default for --gpu-memory-utilization when neither it nor `share` is set.
DEFAULT_UTIL = 0.9


class VllmSpec(ServerSpec):
    """A `vllm serve` entry: ServerSpec plus vLLM's own flags."""

    kind: Literal["vllm"] = Field(  # type: ignore[assignment]
        "vllm", description=ServerSpec.model_fields["kind"].description)

    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """vLLM --gpu-memory-utilization (defaults to `share` when unset)."""

    tensor_parallel_size: int | None = Field(None, ge=1)
    """vLLM --tensor-parallel-size."""

    pipeline_parallel_size: int | None = Field(None, ge=1)
    """vLLM --pipeline-parallel-size."""

    max_model_len: int | None = Field(None, ge=1)
    """vLLM --max-model-len: context length in tokens (prompt and output)."""

    max_num_seqs: int | None = Field(None, ge=1)
    """vLLM --max-num-seqs: sequences scheduled in one step."""

    kv_offloading_size: float | None = Field(None, gt=0)
    """vLLM --kv-offloading-size: host-memory KV cache offload buffer in GiB (summed over TP ranks);
    the host<->GPU copies it causes are the traffic the transfer engine speeds up."""

    kv_offloading_backend: Literal["native", "lmcache"] | None = None
    """vLLM --kv-offloading-backend (vLLM's default: native); used only with kv_offloading_size."""

    enforce_eager: bool | None = None
    """vLLM --enforce-eager; unset: on when three or more servers share a GPU."""

    enable_prefix_caching: bool | None = None
    """vLLM --enable-prefix-caching / --disable-prefix-caching (older: --no-enable-prefix-caching); unset
    keeps vLLM's default."""

    enable_sleep_mode: bool = False
    """vLLM --enable-sleep-mode; gpudash then also sets VLLM_SERVER_DEV_MODE=1, which vLLM needs to
    serve /sleep and /wake_up (`gpudash server sleep|wake NAME`, the Servers view's sleep/wake keys)."""

    def memory_share(self) -> tuple[float | None, str]:
        """gpu_memory_utilization, else share, else vLLM's default (vLLM always reserves it); unknown for
        an attached server, whose flags are its own."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization, "gpu_memory_utilization"
        if self.share is not None:
            return self.share, "share"
        if self.attached:  # its own command line decides, which gpudash does not set
            return None, ""
        return DEFAULT_UTIL, "vLLM default"

    @model_validator(mode="after")
    def _vllm_fields(self) -> VllmSpec:
        if self.kv_offloading_backend is not None and self.kv_offloading_size is None:
            raise ValueError("kv_offloading_backend needs kv_offloading_size (GiB of host memory for the "
                             "offloaded KV cache); set it or remove kv_offloading_backend")
        return self
