"""gpudash's settings: one typed model, loaded from TOML, with embedded defaults so no file is needed.

- settings.py: the file's sections and the whole Config, loading and printing it;
- servers.py: a [[servers]] entry's fields that every kind has (ServerSpec);
- llama_cpp.py, vllm.py: each kind's own fields, a ServerSpec subclass named in SPEC_CLASSES below;
- edit.py: the changes gpudash writes into the user's file;
- files.py, values.py: finding and reading the file, and engine knob values as typed, without pydantic.

Everything is imported from here (`from gpudash.config import Config, ServerSpec`). This package is the
ground floor beside gpudash.records: it imports nothing of gpudash but the engine's knob table (the
engine stands alone) and the small helpers. The pydantic models are imported on first use (PEP 562): they
cost a third of a second, which `gpudash run` (it reads only [engine], through files.py and values.py)
does not pay before it starts its program.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpudash import APP_NAME
from gpudash.config.files import ConfigError, default_config_path, read_config_file
from gpudash.config.values import parse_knobs, parse_size

# public name -> the submodule that defines it, for the names imported on first use
_LAZY = {
    **dict.fromkeys(("Config", "EngineSettings", "FleetConfig", "LlamaConfig", "PoolsConfig", "ProbeConfig",
                     "PrometheusConfig", "SamplingConfig", "SimConfig", "StoreConfig", "load_config",
                     "prometheus_url", "to_toml", "validate"), "settings"),
    "SPEC_CLASSES": "servers", "ServerSpec": "servers", "LlamaCppSpec": "llama_cpp", "VllmSpec": "vllm",
    "save_engine_knobs": "edit", "save_server": "edit",
}

__all__ = sorted(["APP_NAME", "ConfigError", "default_config_path", "parse_knobs", "parse_size",
                  "read_config_file", *_LAZY])

if TYPE_CHECKING:
    from gpudash.config.edit import save_engine_knobs, save_server
    from gpudash.config.llama_cpp import LlamaCppSpec
    from gpudash.config.servers import SPEC_CLASSES, ServerSpec
    from gpudash.config.settings import (Config, EngineSettings, FleetConfig, LlamaConfig, PoolsConfig, ProbeConfig,
                                         PrometheusConfig, SamplingConfig, SimConfig, StoreConfig, load_config,
                                         prometheus_url, to_toml, validate)
    from gpudash.config.vllm import VllmSpec


def _models() -> None:
    """Import the models and name each server kind's fields class (a new kind's fields: one line here)."""
    from gpudash.config.llama_cpp import LlamaCppSpec
    from gpudash.config.servers import SPEC_CLASSES
    from gpudash.config.vllm import VllmSpec

    SPEC_CLASSES.update({"llama.cpp": LlamaCppSpec, "vllm": VllmSpec})


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _models()
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
