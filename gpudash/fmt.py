"""Number formatting shared by the TUI and the one-shot commands (NA shows as an em dash, never as zero),
and JSON that any parser reads."""

from __future__ import annotations

import json
import math
import time

NA = "—"
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def size(n: float | None) -> str:
    """Bytes as a short binary size: 12.3 GiB."""
    if n is None:
        return NA
    for unit, scale in _BINARY:
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def size_to_act_on(n: int) -> str:
    """A size in a sentence someone may act on: 3.0 MiB, or 11.8 MiB (12345678 bytes) when the short form
    rounds, so a limit such as "at least" can still be met exactly."""
    scale = next((s for _, s in _BINARY if abs(n) >= s), 1)
    return size(n) if round(n / scale, 1) * scale == n else f"{size(n)} ({n} bytes)"


def exact_size(n: int) -> str:
    """A size as a form field takes it back unchanged: 64MiB, 1GiB, 2.81MB, or plain bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    if n >= 10**6 and round(float(f"{n / 1e6:g}") * 1e6) == n:
        return f"{n / 1e6:g}MB"
    return str(n)


def knob(value: object) -> str:
    """An engine knob's value as the config writes it: sizes (4096 bytes and up) as 4MiB or 2.81MB,
    counts and flags as they are."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 4096:
        return exact_size(value)
    return str(value)


def knob_text(value: object) -> str:
    """An engine knob's value to read (a table, an event): sizes (4096 bytes and up) in binary units to
    two decimals, like every other size on screen (2.68 MiB, 16 MiB); counts and flags as they are.
    A form or config file takes `knob`'s exact spelling instead."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 4096:
        unit, scale = next((u, sc) for u, sc in _BINARY if value >= sc)
        return f"{value / scale:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return str(value)


def rate(bps: float | None) -> str:
    """Bytes/s as GB/s (10**9, like PCIe figures)."""
    return NA if bps is None else f"{bps / 1e9:.2f} GB/s"


def pct(x: float | None, digits: int = 0) -> str:
    """A 0..1 fraction as a percentage."""
    return NA if x is None else f"{x * 100:.{digits}f}%"


def num(x: float | None, fmt: str = ".0f", unit: str = "") -> str:
    return NA if x is None else f"{x:{fmt}}{unit}"


def held_down_by(reasons: str | None) -> str:
    """What holds a GPU's SM clock down, as NVML's clock event reasons name it ("sw_power_cap,hw_slowdown"):
    the reasons with a space after each comma, "nothing" for none, NA where the driver did not say. The
    TUI's cards and `status` both read "held down by" this."""
    if reasons is None:
        return NA
    return "nothing" if reasons == "none" else reasons.replace(",", ", ")


def duration(s: float | None) -> str:
    if s is None:
        return NA
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def clock(ts: float | None) -> str:
    """A Unix time as the local date and time: 2026-12-01 22:47:58."""
    return NA if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def session_end(ended: float | None, state: str) -> str:
    """When a recorded session ended, or, without an end, why: live (its writer runs), interrupted (its
    writer is gone) or open (written on another host)."""
    return clock(ended) if ended is not None else state


def json_text(value: object, **dumps: object) -> str:
    """`value` as JSON that every parser reads: a number that is not finite (a server's -Inf, which Python
    would write as -Infinity) as null, bytes (a BLOB another tool put in a database) as hex, anything else
    not JSON as its text. `dumps` goes to json.dumps (indent, sort_keys)."""
    return json.dumps(_plain(value), allow_nan=False, default=str, **dumps)  # type: ignore[arg-type]


def _plain(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
