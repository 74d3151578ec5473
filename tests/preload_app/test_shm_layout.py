"""gpudash/preload/shm.py's ctypes structs have the C header's sizes and offsets, field by field: the
header is compiled by the system compiler and asked."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from gpudash.engine import _native as N
from gpudash.preload import shm as P

STRUCTS = {"gp_direction_stats": P.DirectionStatsC, "gp_stats_block": P.StatsBlockC,
           "gp_knobs_block": P.KnobsBlockC}


def _layout(program: Path) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    offsets: dict[str, dict[str, int]] = {}
    consts: dict[str, list[str]] = {}
    for line in subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout.splitlines():
        head, key, *rest = line.split()
        if head == "consts":
            consts[key] = rest
        else:
            offsets.setdefault(head, {})[key] = int(rest[0])
    return offsets, consts


def test_every_struct_matches_the_header(layout_program: Path) -> None:
    offsets, _ = _layout(layout_program)
    assert set(offsets) == set(STRUCTS)
    for cname, cls in STRUCTS.items():
        c = offsets[cname]
        assert ctypes.sizeof(cls) == c["sizeof"], cname
        py_fields = [f for f, _ in cls._fields_]
        assert sorted(py_fields) == sorted(k for k in c if k != "sizeof"), f"{cname}: field names differ"
        for f in py_fields:
            assert getattr(cls, f).offset == c[f], f"{cname}.{f}"


def test_constants_match_the_header(layout_program: Path) -> None:
    _, consts = _layout(layout_program)
    assert consts["magic"] == [str(P.MAGIC), "version", str(P.VERSION), "max_paths", str(P.MAX_PATHS),
                               "name_len", str(P.NAME_LEN)]
    assert len(P.STATES) == 4 and consts["states"] == ["0", "1", "2", "3"]
    assert consts["fmt"] == [f"/{P.STATS_PREFIX}%d", f"/{P.KNOBS_PREFIX}%d"]
    assert consts["why"] == [str(len(P.PASS_REASONS)), str(P.PASS_REASONS.index("pinned, direct path only")),
                             str(P.PASS_REASONS.index("a call failed"))]
    # The embedded engine structs are the ones gpudash/engine/_native.py already keeps equal to gpudash_engine.h.
    assert P.StatsBlockC.paths.size == P.MAX_PATHS * ctypes.sizeof(N.PathStatsC)
    assert P.StatsBlockC.links.size == P.MAX_GPUS * ctypes.sizeof(N.LinkStatsC)
