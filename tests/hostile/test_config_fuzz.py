"""The config against anything a file can hold: every input is a Config or ConfigError lines, never another
exception; what validates prints as TOML that validates to the same Config; and the values that used to
pass and break later are refused by `gpudash config show` with one line naming the field."""

from __future__ import annotations

import math
import os
import tomllib
from pathlib import Path

import pytest
import tomli_w
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudash.cli import main
from gpudash.config import Config, ConfigError, ServerSpec, to_toml, validate

# Values of every kind, with the edges that broke things: inf, nan, 1e10, 2**63, negatives, huge strings.
scalars = st.one_of(
    st.booleans(), st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e10, -0.0, 2.0**63, 1e-300]),
    st.text(max_size=20), st.sampled_from(["4MiB", "1e9", "inf", "nan", "-1", "99 GB", "", "ctrl+q"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
hosts = st.sampled_from(["127.0.0.1", "localhost", "::1", "0.0.0.0", ""])  # no DNS lookups in the fuzz loop


def _section(model: type) -> st.SearchStrategy[dict]:
    """Dicts over a section's real field names (and a stray one), each value from anywhere."""
    names = [*model.model_fields, "no_such_field"]
    return st.dictionaries(st.sampled_from(names), values, max_size=4)


def _server() -> st.SearchStrategy[dict]:
    base = st.fixed_dictionaries({"name": st.sampled_from(["a", "b", "bad name!"]), "model": st.just("m.gguf"),
                                  "host": hosts})
    return st.tuples(base, _section(ServerSpec).map(lambda d: {k: v for k, v in d.items() if k != "host"})) \
        .map(lambda t: {**t[1], **t[0]})


configs = st.fixed_dictionaries({}, optional={
    name: (st.lists(_server(), max_size=3) if name == "servers" else
           _section(field.annotation) if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields")
           else values)
    for name, field in Config.model_fields.items()})


def _finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs)
def test_any_data_is_a_config_or_config_errors(data: dict) -> None:
    try:
        cfg = validate(data, "fuzz.toml")
    except ConfigError as err:
        assert err.problems and all(line.startswith("fuzz.toml: ") and "\n" not in line for line in err.problems)
        return
    assert _finite(cfg.model_dump(mode="json"))  # nothing infinite or NaN gets through
    again = validate(tomllib.loads(to_toml(cfg)), "round-trip")
    assert again == cfg


def _show(tmp_path: Path, text: str | bytes):
    path = tmp_path / "c.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return CliRunner().invoke(main, ["--config", str(path), "config", "show"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(configs)
def test_config_show_exits_0_or_2_without_a_traceback(tmp_path: Path, data: dict) -> None:
    try:
        text = tomli_w.dumps(data)
    except (TypeError, ValueError):  # not representable in TOML (e.g. a mixed nesting tomli_w refuses)
        return
    r = _show(tmp_path, text)
    assert r.exit_code in (0, 2), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)


SERVER = '[[servers]]\nname = "a"\nmodel = "m.gguf"\n'
REFUSED = {
    "source_timeout_s inf": ("[sampling]\nsource_timeout_s = inf\n", "sampling.source_timeout_s"),
    "source_timeout_s 1e10": ("[sampling]\nsource_timeout_s = 1e10\n", "sampling.source_timeout_s"),
    "probe interval inf": ("[probe]\ninterval_s = inf\n", "probe.interval_s"),
    "probe timeout nan": ("[probe]\ntimeout_s = nan\n", "probe.timeout_s"),
    "health timeout inf": (SERVER + "health_timeout_s = inf\n", "servers.0.health_timeout_s"),
    "registration cache over the engine's limit": ("[engine]\nregistration_cache_bytes = 2251799813685249\n",
                                                   "engine.registration_cache_bytes"),
    "tensor_split nan": (SERVER + "tensor_split = [nan, 1.0]\n", "servers.0"),
    "tensor_split inf": (SERVER + "tensor_split = [inf, 1.0]\n", "servers.0"),
    "tensor_split longer than gpus": (SERVER + "gpus = [0, 1]\ntensor_split = [1, 1, 1, 1, 1]\n", "servers.0"),
    "negative gpu": (SERVER + "gpus = [-1]\n", "servers.0.gpus.0"),
    "gpu out of range": (SERVER + "gpus = [0, 99]\n", "servers.0.gpus.1"),
    "unresolvable host": (SERVER + 'host = "locahost.invalid"\n', "servers.0.host"),
    "deep nesting": ("a = " + "[" * 2000 + "]" * 2000 + "\n", "nested too deeply"),
    "env name with =": (SERVER + 'env = { "A=B" = "x" }\n', "servers.0.env"),
    "empty env name": (SERVER + 'env = { "" = "x" }\n', "servers.0.env"),
    "NUL in an env value": (SERVER + 'env = { A = "x\\u0000y" }\n', "servers.0.env"),
    "NUL in extra_args": (SERVER + 'extra_args = ["--x", "a\\u0000b"]\n', "servers.0.extra_args"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_values_that_broke_later_are_refused_now(tmp_path: Path, case: str) -> None:
    text, where = REFUSED[case]
    r = _show(tmp_path, text)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln]
    assert lines and all(ln.startswith("gpudash: ") for ln in lines) and any(where in ln for ln in lines), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_a_fifo_config_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    r = CliRunner().invoke(main, ["--config", str(fifo), "config", "show"])
    assert r.exit_code == 2 and "not a regular file" in r.output


def test_config_show_and_the_copies_on_disk_mask_secrets(tmp_path: Path) -> None:
    """config show goes to terminals, logs and pastes too: it masks secrets like every copy gpudash writes."""
    r = _show(tmp_path, SERVER + 'env = { HF_TOKEN = "hf_abc" }\n')
    assert r.exit_code == 0 and "hf_abc" not in r.output and 'HF_TOKEN = "***"' in r.output
    cfg = validate(tomllib.loads(SERVER + 'env = { HF_TOKEN = "hf_abc" }\n'))
    assert "hf_abc" not in to_toml(cfg, redacted=True)


def test_a_bad_env_or_argument_stops_serve_before_any_server_starts(tmp_path: Path) -> None:
    """Through `gpudash serve`: one line, exit 2, no traceback (these used to pass the config and crash
    serve when it started the server)."""
    from hostile_helpers import gpudash

    marker = tmp_path / "started"
    exe = tmp_path / "vllm"
    exe.write_text(f"#!/bin/sh\ntouch {marker}\n")
    exe.chmod(0o755)
    for extra in ('env = { "A=B" = "x" }', 'extra_args = ["a\\u0000b"]'):
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[[servers]]\nname = "v"\nkind = "vllm"\nmodel = "m"\nbinary = "{exe}"\n{extra}\n')
        r = gpudash("--config", str(cfg), "serve", "--db", str(tmp_path / "g.db"), "--sim", "h200", "--quiet",
                    home=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "servers.0." in r.stderr, r.stderr
        assert not marker.exists()
