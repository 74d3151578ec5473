"""Only gpudash/tui imports textual: importing the whole core in a fresh interpreter must not load it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Packages whose every module is core; single core modules; the engine library (stands alone).
SCRIPT = r"""
import importlib, importlib.util, pkgutil, sys
core = ["gpudash.records", "gpudash.config", "gpudash.cli", "gpudash.store", "gpudash.engine"]
core += [m for m in ("gpudash.control",) if importlib.util.find_spec(m)]
for pkg in ("gpudash.telemetry", "gpudash.store", "gpudash.launcher", "gpudash.advisor", "gpudash.engine"):
    mod = importlib.import_module(pkg)
    found = [info.name for info in pkgutil.walk_packages(mod.__path__, pkg + ".")]
    core += [n for n in found if importlib.util.find_spec(n).origin.endswith(".py")]  # not the native .so
for name in core:
    importlib.import_module(name)
print(len(core))
print(",".join(sorted(m for m in sys.modules if m == "textual" or m.startswith("textual."))))
"""


def test_core_does_not_import_textual() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    count, textual_modules = proc.stdout.splitlines()
    assert int(count) > 10  # the walk really found the core's modules
    assert textual_modules == "", f"core imported {textual_modules}"
