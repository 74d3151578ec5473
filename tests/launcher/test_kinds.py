"""The server-kind seam: a third kind, whole in one file (toy_kind.py) plus one registry line, is
validated from a config, launched, scraped and recorded like llama.cpp and vLLM; and nothing outside
gpudash/launcher/kinds/ compares kind names."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from gpudash.config import ConfigError, ServerSpec, validate
from gpudash.launcher.kinds import kind_of, kind_running
from gpudash.telemetry.servers import ServerSource
from toy_kind import Toy, ToySpec, register

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Toy:
    return register(monkeypatch)  # the registry lines


def test_a_config_names_the_new_kind_and_its_own_fields(toy: Toy) -> None:
    cfg = validate({"servers": [{"name": "t", "kind": "toy", "speed": 50}]})
    (spec,) = cfg.servers
    assert isinstance(spec, ToySpec) and spec.speed == 50 and kind_of(spec) is toy
    with pytest.raises(ConfigError) as err:
        validate({"servers": [{"name": "t", "kind": "toy", "tensor_split": [1, 1]}]}, "c.toml")
    assert str(err.value) == ("c.toml: servers.0: tensor_split not valid for kind 'toy'; remove it or set "
                              "kind = 'llama.cpp'")
    with pytest.raises(ConfigError, match="servers.0.speed"):
        validate({"servers": [{"name": "t", "kind": "toy", "speed": -1}]})


def test_an_unknown_kind_is_named_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        validate({"servers": [{"name": "s", "kind": "sglang", "model": "m"}]}, "c.toml")
    assert str(err.value) == "c.toml: servers.0: kind 'sglang' is not one gpudash knows; use one of: llama.cpp, vllm"


def test_the_new_kind_launches_and_is_scraped(toy: Toy, make_supervisor, events) -> None:
    sup = make_supervisor([ServerSpec(name="t", kind="toy", speed=200, health_timeout_s=30)])
    sup.start_all()
    assert [e.kind for e in events.drain()] == ["server.start", "server.ready"]
    source = ServerSource(sup)
    try:
        source.poll()
        time.sleep(0.5)
        (st,) = source.poll()["servers"]
    finally:
        source.close()
    assert (st.kind, st.state, st.origin) == ("toy", "ready", "managed")
    assert st.tokens_per_s == pytest.approx(200, rel=0.3)  # the toy's counter over wall-clock time
    (pid,) = [p for p, name in sup.pids().items() if name == "t"]
    assert kind_running(list(open(f"/proc/{pid}/cmdline").read().split("\0")[:-1])) is toy  # discovery knows it


def test_no_kind_name_is_compared_outside_the_kind_modules() -> None:
    """`kind ==`, `kind !=` or `kind in` against a server kind's name, or an isinstance test against a kind's
    own spec class (a kind's feature is a ServerKind capability), anywhere in the app but kinds/."""
    pattern = re.compile(r"""\bkind\s*(==|!=|in)\s*[(\["']*(llama\.cpp|vllm)|isinstance\([^)]*\b(LlamaCppSpec|VllmSpec)\b""")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "gpudash").rglob("*.py")
                 if "kinds" not in p.parts
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
