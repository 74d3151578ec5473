"""csrc/knob_limits.h, written from the knob table so the C++ range check and the ge_knobs layout check
use the same numbers as Python. Regenerate with `python -m engine.knob_header` after changing a native
knob in engine/config.py; a test fails while the checked-in header differs from `render()`."""

from __future__ import annotations

import sys
from pathlib import Path

from engine.config import KNOB, c_layout

HEADER = Path(__file__).resolve().parent.parent / "csrc" / "knob_limits.h"


def _literal(n: int, ctype: str) -> str:
    return f"{n}ull" if ctype == "uint64_t" else str(n)


def render() -> str:
    """The header's text."""
    rows = []
    size = 0
    for name, ctype, offset in c_layout():
        size = offset + (8 if ctype == "uint64_t" else 4)
        if name.startswith("reserved"):
            continue
        k = KNOB[name]
        rows.append(f"  X({name}, {ctype}, {offset}, {_literal(k.low, ctype)}, {_literal(k.high, ctype)})")
    table = " \\\n".join(rows)
    return f"""/* Generated from KNOB_TABLE in engine/config.py by `python -m engine.knob_header`; do not edit.
 * tests/engine/test_knob_header.py fails while this file and the table differ. */
#ifndef GPUDASH_KNOB_LIMITS_H
#define GPUDASH_KNOB_LIMITS_H

/* X(field, C type, byte offset in ge_knobs, lowest, highest) for each knob the data plane reads. */
#define GE_KNOB_TABLE(X) \\
{table}

#define GE_KNOBS_SIZE {size}

#endif
"""


def main() -> None:
    HEADER.write_text(render(), encoding="utf-8")
    print(f"wrote {HEADER}", file=sys.stderr)


if __name__ == "__main__":
    main()
