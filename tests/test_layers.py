"""The house, floor by floor (README "Layout"): imports run downwards only, no two packages import each
other, the root holds only the entry point, the settings, the records and small helpers, NVML is called in
gpu/ alone, and the TUI wires nothing: it imports runtime/ for everything that runs, reads or changes,
and below that only the ground floor and the pure view helpers listed here.

Read from the source with ast (tests/test_import_cycles.py), every import counted, lazy ones included."""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_cycles import PACKAGE, gpudash_graph, module_files

# The floors, lowest first. A module may import its own unit and any unit on a lower floor; within a floor,
# units may import each other one way only (checked below). The engine stands alone (it imports nothing of
# gpudash), so any floor may use it as it would a library.
FLOORS: list[set[str]] = [
    {"gpudash", "labels", "fmt", "outside", "redact", "private_fs", "proctree", "hangup", "engine"},
    {"records", "config"},
    {"gpu"},
    {"preload", "store", "fleet", "launcher", "telemetry", "advisor"},
    {"runtime"},
    {"tui", "commands"},
    {"cli", "__main__"},
]
FLOOR = {unit: n for n, units in enumerate(FLOORS) for unit in units}

# Pure functions and types over records that the views compute what they show with: no I/O, no threads.
VIEW_HELPERS = {
    "gpudash.advisor.planner",  # the -ts split proposal the Split tab shows
    "gpudash.advisor.rates",  # link rates against what a link carries
    "gpudash.engine.config",  # the knob table the knob form is built from
    "gpudash.fleet.boxes",  # the fleet's records and their states (FleetBox, DOWN, STALE)
    "gpudash.fleet.cells",  # a box's and a server's cells, as `gpudash fleet` prints them
    "gpudash.launcher.logparse",  # what a server's log line says
    "gpudash.launcher.probe.cache_kinds",  # which cache served a probe request
    "gpudash.launcher.probe.correlation",  # TTFT against the hit fraction
    "gpudash.launcher.shares",  # a server's memory share against what it holds
    "gpudash.telemetry.links",  # what a PCIe link carries
}
ROOT_MODULES = {"gpudash", "gpudash.__main__", "gpudash.cli", "gpudash.records", "gpudash.labels", "gpudash.fmt",
                "gpudash.outside", "gpudash.redact", "gpudash.private_fs", "gpudash.proctree", "gpudash.hangup"}


def unit(module: str) -> str:
    """The top-level unit a module belongs to: a package under gpudash/, or a root module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gpudash"


def unit_arrows() -> dict[tuple[str, str], list[str]]:
    """{(from unit, to unit): the module imports behind the arrow}."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for module, deps in gpudash_graph().items():
        for dep in deps:
            if unit(module) != unit(dep):
                arrows.setdefault((unit(module), unit(dep)), []).append(f"{module} -> {dep}")
    return arrows


def test_every_unit_has_a_floor() -> None:
    units = {unit(m) for m in module_files()}
    assert units - set(FLOOR) == set(), "give the new package a floor in FLOORS"
    assert set(FLOOR) - units == set(), "a unit in FLOORS that is gone"


def test_imports_run_downwards_only() -> None:
    upwards = {arrow: why for arrow, why in unit_arrows().items() if FLOOR[arrow[0]] < FLOOR[arrow[1]]}
    assert upwards == {}


def test_no_two_units_import_each_other() -> None:
    arrows = unit_arrows()
    pairs = {(a, b): (arrows[a, b], arrows[b, a]) for a, b in arrows if (b, a) in arrows and a < b}
    assert pairs == {}


def test_the_engine_stands_alone() -> None:
    assert [a for a in unit_arrows() if a[0] == "engine"] == []


def test_the_root_holds_only_the_entry_point_settings_records_and_small_helpers() -> None:
    root = {m for m, path in module_files().items() if path.parent == PACKAGE and m.count(".") <= 1}
    assert root == ROOT_MODULES


def test_the_tui_wires_nothing() -> None:
    """tui/ imports runtime/, the ground floor and the pure view helpers; nothing that runs or reads below."""
    below = {dep for module, deps in gpudash_graph().items() if unit(module) == "tui" for dep in deps}
    allowed_units = {"tui", "runtime"} | FLOORS[0] - {"engine"} | FLOORS[1]
    packages = {h.rsplit(".", n)[0] for h in VIEW_HELPERS for n in range(1, h.count("."))}  # docstring-only __init__s
    stray = sorted(d for d in below if unit(d) not in allowed_units and d not in VIEW_HELPERS | packages)
    assert stray == []


def test_view_helpers_do_no_io() -> None:
    """Each view helper imports nothing that does I/O or runs threads (by the names it imports)."""
    forbidden = {"threading", "subprocess", "socket", "httpx", "sqlite3", "sqlite_utils", "psutil", "pynvml"}
    files = module_files()
    for name in VIEW_HELPERS:
        tree = ast.parse(files[name].read_text(encoding="utf-8"))
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imported & forbidden == set(), name


def test_nvml_is_called_in_gpu_only() -> None:
    users = sorted(m for m, path in module_files().items()
                   if "pynvml" in _imported_roots(path) and not m.startswith("gpudash.gpu"))
    assert users == []


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return out | {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
