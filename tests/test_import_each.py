"""Every module of gpudash imports on its own, first, in an interpreter that has imported nothing of gpudash:
an import order that works only because something else was imported before hides a circle
(`python -c "import gpudash.shares"` failed that way while every test passed).

Each module is imported in a child forked from a parent that holds no gpudash module, which is a fresh
interpreter as far as gpudash is concerned and costs milliseconds instead of a Python start per module."""

from __future__ import annotations

import json
import os
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


# The engine's light modules: the package (its names are imported on first use), the knob table, the sim
# profiles, its errors and the C ABI's declarations (ctypes structs; no library is loaded). Anything else of
# the engine is its copy machinery, which pulls in numpy.
ENGINE_LIGHT = {"gpudash.engine", "gpudash.engine.config", "gpudash.engine.profiles", "gpudash.engine.errors",
                "gpudash.engine._native"}
HELD = r"""
import importlib, json, os, sys
from gpudash.cli import COMMANDS
out = {}
for name, target in sorted(COMMANDS.items()):
    pid = os.fork()
    if pid == 0:
        importlib.import_module(target.split(":")[0])
        print(json.dumps([name, sorted(m for m in sys.modules if m == "numpy" or m.startswith("gpudash.engine"))]),
              flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""
# Commands that use neither the engine nor a model file, run whole (issue 46). Not here: the ones that open the
# store (history, export, store prune): sqlite-utils imports numpy (and pandas) itself when they are installed
# (sqlite_utils/db.py, for its column types), which store/ would have to keep from it.
NO_ENGINE = [["config", "show"], ["config", "path"], ["deploy", "systemd"], ["llama", "list"]]
RUN_HELD = r"""
import json, sys
from gpudash.cli import main
try:
    main(sys.argv[1:], prog_name="gpudash")
except SystemExit as done:
    code = done.code
print(json.dumps([code, sorted(m for m in sys.modules if m == "numpy" or m.startswith("gpudash.engine"))]))
"""


def test_no_command_module_imports_numpy_or_the_engines_machinery() -> None:
    """Each command's module, imported first in a fresh interpreter (a child forked from one that holds only
    the CLI's table), holds no numpy and no engine module past the light ones."""
    proc = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    held = dict(json.loads(line) for line in proc.stdout.splitlines())
    assert len(held) > 15
    assert {name: mods for name, mods in held.items() if set(mods) - ENGINE_LIGHT} == {}


def test_commands_that_use_no_engine_run_without_numpy(tmp_path: Path) -> None:
    env = {**os.environ, **{f"XDG_{d}_HOME": str(tmp_path / d) for d in ("CONFIG", "DATA", "CACHE", "STATE")}}
    for args in NO_ENGINE:
        proc = subprocess.run([sys.executable, "-c", RUN_HELD, *args], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=120)
        code, mods = json.loads(proc.stdout.strip().splitlines()[-1])
        assert code in (0, None), (args, proc.stderr)
        assert set(mods) <= ENGINE_LIGHT - {"gpudash.engine._native"}, (args, mods)
