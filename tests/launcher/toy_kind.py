"""A third server kind, whole in this one file: what a new kind needs to be launched, scraped, recorded
and shown. A test registers it with `register(monkeypatch)`: one line for its fields (SPEC_CLASSES) and one
for the kind (KINDS); nothing else changes."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

import pytest

from gpudash.config import SPEC_CLASSES, ServerSpec
from gpudash.launcher.counters import Prev, rate
from gpudash.launcher.kinds import KINDS
from gpudash.launcher.kinds.base import Option, ServerKind

TOY_SERVER = Path(__file__).resolve().parents[1] / "doubles" / "toy_server.py"


class ToySpec(ServerSpec):
    """A toy server entry: ServerSpec plus the toy's one setting."""

    kind: Literal["toy"] = Field(  # type: ignore[assignment]
        "toy", description=ServerSpec.model_fields["kind"].description)
    needs_model: ClassVar[bool] = False  # the toy serves no model

    speed: float = Field(10.0, gt=0)
    """Tokens per second the toy counts."""


class Toy(ServerKind):
    name = "toy"
    label = "toy-server"
    spec_class = ToySpec
    default_port = 9999
    metric_prefix = "toy:"
    metric_families = frozenset({"toy:"})
    models_owner = "toy"

    def find_binary(self, spec: ServerSpec) -> str:
        return sys.executable

    def help_commands(self, binary: str) -> list[list[str]]:
        return [[binary, str(TOY_SERVER), "--help"]]

    def head(self, spec: ServerSpec, binary: str) -> list[str]:
        return [binary, str(TOY_SERVER)]

    def options(self, spec: ServerSpec, port: int, peers: Sequence[ServerSpec]) -> list[Option]:
        assert isinstance(spec, ToySpec)
        return [Option("host", ("--host",), spec.host), Option("port", ("--port",), str(port)),
                Option("speed", ("--speed",), f"{spec.speed:g}")]

    def fields(self, m: dict[str, float], prev: Prev | None, pid: int | None, now: float,
               base: Prev | None = None) -> dict[str, Any]:
        return {"tokens_per_s": rate(m, prev, pid, now, "toy:tokens_total")}

    def matches(self, cmdline: Sequence[str]) -> bool:
        return any(w.endswith("toy_server.py") for w in cmdline[:2])


def register(monkeypatch: pytest.MonkeyPatch) -> Toy:
    """The toy in both registries for one test: its fields (config) and its kind (launcher)."""
    kind = Toy()
    monkeypatch.setitem(SPEC_CLASSES, kind.name, ToySpec)
    monkeypatch.setitem(KINDS, kind.name, kind)
    return kind
