"""Server kinds: one module each behind ServerKind (base.py), and the registry that names them.

A new kind is its fields (a ServerSpec subclass under gpudash/config/, one line in SPEC_CLASSES there) and
one module here (copy vllm.py's shape: a ServerKind whose spec_class is those fields), one line in KINDS.
Everything else reaches a kind through `kind_of(spec)` or `kind_named(name)`.
"""

from __future__ import annotations

from gpudash.config import ServerSpec
from gpudash.launcher.kinds.base import ServerKind
from gpudash.launcher.kinds.llama_cpp import LlamaCpp
from gpudash.launcher.kinds.vllm import Vllm

KINDS: dict[str, ServerKind] = {k.name: k for k in (LlamaCpp(), Vllm())}

__all__ = ["KINDS", "ServerKind", "kind_named", "kind_of", "kind_recognising", "kind_running"]


def kind_named(name: str) -> ServerKind:
    """The kind called `name`; ValueError naming the kinds there are."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"kind {name!r} is not one gpudash knows; use one of: {', '.join(KINDS)}") from None


def kind_of(spec: ServerSpec) -> ServerKind:
    """The kind of a spec (ValueError for an attached server whose kind is not known yet)."""
    if spec.kind is None:
        raise ValueError(f"{spec.name}: its kind is not known yet (an attached server says it on its first scrape)")
    return kind_named(spec.kind)


def kind_recognising(metrics_text: str) -> ServerKind | None:
    """The kind whose families a /metrics answer has, or None."""
    return next((k for k in KINDS.values() if k.recognises(metrics_text)), None)


def kind_running(cmdline: list[str]) -> ServerKind | None:
    """The kind a process command line runs, or None."""
    return next((k for k in KINDS.values() if k.matches(cmdline)), None)
