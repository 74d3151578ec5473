"""Only gpudash/tui imports textual: importing the whole core in a fresh interpreter must not load it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_import_cycles import module_files

REPO = Path(__file__).resolve().parents[1]

# Every module outside tui/ and commands/ (the commands may start the TUI) is core.
SCRIPT = r"""
import importlib, sys
core = sys.argv[1:]
for name in core:
    importlib.import_module(name)
print(len(core))
print(",".join(sorted(m for m in sys.modules if m == "textual" or m.startswith("textual."))))
"""


def test_core_does_not_import_textual() -> None:
    core = sorted(m for m in module_files() if not m.startswith(("gpudash.tui", "gpudash.commands", "gpudash.__main__")))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *core], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    count, textual_modules = proc.stdout.splitlines()
    assert int(count) > 100  # the walk really found the core's modules
    assert textual_modules == "", f"core imported {textual_modules}"
