"""Engine knob values as a person or a file gives them ("4MiB", "3", "false", a TOML 1), read without the
settings model: the one rule that the [engine] settings, the knob form, control and `gpudash run` all use.
Sizes go through `parse_size`; the rest is read as pydantic reads an int or a bool field (pydantic_core's
own validators, in lax mode), and the knob table's `Knob.check` decides. Light on purpose, so `gpudash run`
can check its knobs before it starts its program without importing pydantic's models."""

from __future__ import annotations

import math
import re
from functools import cache
from typing import Any, Mapping

from gpudash.engine.config import KNOB, KNOBS, KnobValueError

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


@cache
def _reader(is_bool: bool) -> Any:
    """pydantic_core's validator for a bool or an int field (what a pydantic model's field of that type runs)."""
    from pydantic_core import SchemaValidator, core_schema

    return SchemaValidator(core_schema.bool_schema() if is_bool else core_schema.int_schema())


def knob_value(name: str, raw: Any) -> int | bool:
    """Knob `name`'s value from `raw` as typed or written (sizes like 4MiB), checked by the knob table's
    rule; ValueError saying what is wrong with it (the knob is named by the caller)."""
    knob = KNOB[name]
    value = parse_size(raw) if knob.is_size else raw
    if not knob.is_bool and isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)  # what pydantic makes of plain digits, without importing it (`run --knob outstanding=3`)
    if not (isinstance(value, bool) if knob.is_bool else isinstance(value, int) and not isinstance(value, bool)):
        from pydantic_core import ValidationError

        try:
            value = _reader(knob.is_bool).validate_python(value)
        except ValidationError as err:
            raise ValueError(err.errors()[0]["msg"]) from None
    try:
        return knob.check(value)
    except KnobValueError as err:
        raise ValueError(err.reason) from None


def parse_knobs(values: Mapping[str, Any]) -> dict[str, Any]:
    """Engine knob values as a person or a file gives them ("4MiB", "3", True), checked by the knob table's
    rule: what the [engine] settings, the knob form, control and `run --knob` call. A ValueError names the
    first bad knob and why ("outstanding: outstanding must be between 1 and 64, got 0"); a name that is no
    knob is refused too."""
    out: dict[str, Any] = {}
    for name, raw in values.items():
        if name not in KNOB:
            raise ValueError(f"{name}: not an engine knob; the knobs are: {', '.join(KNOBS)}")
        try:
            out[name] = knob_value(name, raw)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    return out
