"""The generated C headers: csrc/knob_limits.h, written from the knob table so the C++ range check and the
ge_knobs layout check use the same numbers as Python, and csrc/abi_version.h, written from
`_native.ABI_VERSION`, the one place the ABI's version is kept (the engine library reports it, the
preload and the ctypes loader refuse any other). Regenerate both with `python -m gpudash.engine.knob_header`
after changing a native knob in gpudash/engine/config.py or the ABI version; a test fails while a
checked-in header differs from what `render()` / `render_abi()` write."""

from __future__ import annotations

import sys
from pathlib import Path

from gpudash.engine._native import ABI_VERSION
from gpudash.engine.config import KNOB, KNOB_TABLE, c_layout

CSRC = Path(__file__).resolve().parents[2] / "csrc"
HEADER = CSRC / "knob_limits.h"
ABI_HEADER = CSRC / "abi_version.h"


def _literal(n: int, ctype: str) -> str:
    return f"{n}ull" if ctype == "uint64_t" else str(n)


def _staging_rows() -> list[str]:
    """The live knobs outside ge_knobs, as a preloaded engine's policy reads them: the pageable staging
    thresholds, one per direction. A live Python-only knob of another kind needs its place in
    csrc/preload first, so it stops the generator instead of being left out silently."""
    rows = []
    for k in KNOB_TABLE:
        if not k.live or k.native:
            continue
        direction = {"h2d_": "GE_H2D", "d2h_": "GE_D2H"}.get(k.name[:4])
        if direction is None or not k.name.endswith("_staging_bytes"):
            raise SystemExit(f"live knob {k.name} is neither in ge_knobs nor a staging threshold: give it a place "
                             "in csrc/preload (shm.c) and in this generator")
        rows.append(f"  X({k.name}, {direction}, {_literal(int(k.default), 'uint64_t')}, "
                    f"{_literal(k.low, 'uint64_t')}, {_literal(k.high, 'uint64_t')})")
    return rows


def render() -> str:
    """The header's text."""
    rows = []
    defaults = []
    size = 0
    for name, ctype, offset in c_layout():
        size = offset + (8 if ctype == "uint64_t" else 4)
        if name.startswith("reserved"):
            continue
        k = KNOB[name]
        rows.append(f"  X({name}, {ctype}, {offset}, {_literal(k.low, ctype)}, {_literal(k.high, ctype)})")
        defaults.append(f"  X({name}, {_literal(0 if k.machine_default else int(k.default), ctype)})")
    checks = []
    for name, ctype, _offset in c_layout():
        if name.startswith("reserved"):
            continue
        k = KNOB[name]
        if k.low > 0 or ctype != "uint64_t":  # an unsigned field is never below 0 (and -Wtype-limits says so)
            checks.append(f"(k).{name} >= {_literal(k.low, ctype)}")
        checks.append(f"(k).{name} <= {_literal(k.high, ctype)}")
    in_range = " && \\\n   ".join(checks)
    table = " \\\n".join(rows)
    default_table = " \\\n".join(defaults)
    staging_table = " \\\n".join(_staging_rows())
    return f"""/* Generated from KNOB_TABLE in gpudash/engine/config.py by `python -m gpudash.engine.knob_header`; do not edit.
 * tests/engine/test_knob_table.py fails while this file and the table differ. */
#ifndef GPUDASH_KNOB_LIMITS_H
#define GPUDASH_KNOB_LIMITS_H

/* X(field, C type, byte offset in ge_knobs, lowest, highest) for each knob the data plane reads. */
#define GE_KNOB_TABLE(X) \\
{table}

#define GE_KNOBS_SIZE {size}

/* The range check of ge_knobs (engine_setup.cpp's validate_knobs): nonzero when every knob the data plane
 * reads is within the table's limits. */
#define GE_KNOBS_IN_RANGE(k) \\
  ({in_range})

/* X(field, default) for the same knobs: a preloaded engine's start-up knobs. 0 where the default is
 * computed on the machine that runs the engine (staging_threads: half its usable cores, 1 to 16). */
#define GE_KNOB_DEFAULTS(X) \\
{default_table}

/* X(name, direction, default, lowest, highest) for the live knobs outside ge_knobs: the pageable staging
 * thresholds. */
#define GE_STAGING_KNOBS(X) \\
{staging_table}

#endif
"""


def render_abi() -> str:
    """abi_version.h's text."""
    return f"""/* Generated from ABI_VERSION in gpudash/engine/_native.py by `python -m gpudash.engine.knob_header`; do not
 * edit. Raise ABI_VERSION there (and regenerate) whenever gpudash_engine.h changes a function or struct. */
#ifndef GPUDASH_ABI_VERSION_H
#define GPUDASH_ABI_VERSION_H

#define GE_ABI_VERSION {ABI_VERSION}

#endif
"""


def main() -> None:
    for path, text in ((HEADER, render()), (ABI_HEADER, render_abi())):
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
