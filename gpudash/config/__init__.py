"""gpudash's settings: one typed model, loaded from TOML, with embedded defaults so no file is needed.

- settings.py: the file's sections and the whole Config, loading and printing it;
- servers.py: a [[servers]] entry's fields that every kind has (ServerSpec);
- llama_cpp.py, vllm.py: each kind's own fields, a ServerSpec subclass named in SPEC_CLASSES below;
- edit.py: the changes gpudash writes into the user's file.

Everything is imported from here (`from gpudash.config import Config, ServerSpec`). This package is the
ground floor beside gpudash.records: it imports nothing of gpudash but the engine's knob table (the
engine stands alone) and the small helpers.
"""

from gpudash import APP_NAME
from gpudash.config.edit import save_engine_knobs, save_server
from gpudash.config.llama_cpp import LlamaCppSpec
from gpudash.config.servers import SPEC_CLASSES, ServerSpec
from gpudash.config.settings import (Config, ConfigError, EngineSettings, FleetConfig, LlamaConfig, PoolsConfig,
                                     ProbeConfig, PrometheusConfig, SamplingConfig, SimConfig, StoreConfig,
                                     default_config_path, load_config, parse_knobs, parse_size, prometheus_url,
                                     to_toml, validate)
from gpudash.config.vllm import VllmSpec

SPEC_CLASSES.update({"llama.cpp": LlamaCppSpec, "vllm": VllmSpec})  # a new kind's fields: one line here

__all__ = [
    "APP_NAME", "Config", "ConfigError", "EngineSettings", "FleetConfig", "LlamaConfig", "LlamaCppSpec",
    "PoolsConfig", "ProbeConfig", "PrometheusConfig", "SPEC_CLASSES", "SamplingConfig", "ServerSpec", "SimConfig",
    "StoreConfig", "VllmSpec", "default_config_path", "load_config", "parse_knobs", "parse_size", "prometheus_url",
    "save_engine_knobs", "save_server", "to_toml", "validate",
]
