"""[[servers]] fields added for current servers: what they accept and the one sentence when they refuse."""

from __future__ import annotations

import pytest

from gpudash.config import ConfigError, validate


def server(**kw) -> dict:
    return {"servers": [{"name": "s", "model": "m.gguf", **kw}]}


@pytest.mark.parametrize("ngl", ["all", "auto", 0, 40, -1, -2])
def test_n_gpu_layers_takes_all_auto_and_numbers(ngl: object) -> None:
    assert validate(server(n_gpu_layers=ngl)).servers[0].n_gpu_layers == ngl


@pytest.mark.parametrize("kw, message", [
    ({"n_gpu_layers": -3}, 'n_gpu_layers -3 is not a layer count; use a number >= 0, "all" or "auto"'),
    ({"n_gpu_layers": "most"}, "n_gpu_layers"),
    ({"flash_attn": "yes"}, "flash_attn"),
    ({"cache_ram_mib": -2}, "cache_ram_mib"),
    ({"kind": "vllm", "kv_offloading_backend": "native"}, "kv_offloading_backend needs kv_offloading_size"),
    ({"enable_sleep_mode": True}, "enable_sleep_mode not valid for kind 'llama.cpp'; remove it or set kind = 'vllm'"),
    ({"max_num_seqs": 8}, "max_num_seqs not valid for kind 'llama.cpp'"),
    ({"kind": "vllm", "fit": "on"}, "fit not valid for kind 'vllm'"),
])
def test_bad_fields_are_named(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(server(**kw), "c.toml")
    assert message in str(err.value) and str(err.value).startswith("c.toml: servers.0")
