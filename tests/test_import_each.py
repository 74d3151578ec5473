"""Every module of gpudash imports on its own, first, in an interpreter that has imported nothing of gpudash:
an import order that works only because something else was imported before hides a circle
(`python -c "import gpudash.shares"` failed that way while every test passed).

Each module is imported in a child forked from a parent that holds no gpudash module, which is a fresh
interpreter as far as gpudash is concerned and costs milliseconds instead of a Python start per module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_import_cycles import module_files

REPO = Path(__file__).resolve().parents[1]

# The libraries gpudash uses are imported once in the parent (they are not what is tested): each child then
# spends its time on gpudash's own imports.
SCRIPT = r"""
import importlib, os, sys
for lib in ("click", "pydantic", "httpx", "numpy", "psutil", "sqlite_utils", "prometheus_client", "rich", "textual",
            "textual.app", "textual.widgets", "textual_plotext", "gguf", "platformdirs", "tomli_w", "pynvml"):
    importlib.import_module(lib)
names = sys.argv[1:]
assert not [m for m in sys.modules if m == "gpudash" or m.startswith("gpudash.")]
for name in names:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException as err:
            print(f"{name}: {type(err).__name__}: {err}", flush=True)
            os._exit(1)
        os._exit(0)
    os.waitpid(pid, 0)
print(f"imported {len(names)}", flush=True)
"""


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    names = sorted(m for m in module_files() if m != "gpudash.__main__")  # importing __main__ runs the CLI
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *names], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    *failures, last = proc.stdout.splitlines()
    assert failures == []
    assert int(last.removeprefix("imported ")) > 150  # the walk found the package's modules
