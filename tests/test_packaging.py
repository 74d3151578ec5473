"""The wheel as a user gets it: built from the checkout (`pip wheel`), installed into a new virtual
environment outside the checkout, then run from a folder outside it with no PYTHONPATH. `gpudash --help`
works and one copy on the engine's sim backend moves exact bytes, with gpudash, gpudash.engine and the
native library all loaded from the environment, never from the checkout. Dependencies come from pip's
cache or index, as any install's do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Run by the new environment's Python: a 13 MiB + 5 B round trip through the sim engine (multipath: above
# the 11.3 MB and 13 MB fallback thresholds), then where each part was loaded from.
COPY = """
import json
import numpy as np
import gpudash, gpudash.engine
from gpudash.engine import EngineConfig, TransferEngine
from gpudash.engine import _native

eng = TransferEngine(EngineConfig(backend="sim", profile="8xh20", sim_time_scale=1.0))
try:
    src = np.random.default_rng(7).integers(0, 256, 13 * 2**20 + 5, dtype=np.uint8)
    dev = eng.alloc_device(3, src.nbytes)
    up = eng.copy(dev.ptr, src, nbytes=src.nbytes).wait()
    out = np.zeros_like(src)
    down = eng.copy(out, dev.ptr, nbytes=src.nbytes).wait()
    exact = bool(np.array_equal(out, src))
finally:
    eng.close()
print(json.dumps({"exact": exact, "gpudash": gpudash.__file__, "engine": gpudash.engine.__file__,
                  "lib": _native.lib()._name, "paths": [up.paths_used, down.paths_used]}))
"""


def _clean_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUDASH_ENGINE_LIB", "VIRTUAL_ENV")}
    env.update(HOME=str(tmp / "home"), XDG_CONFIG_HOME=str(tmp / "config"), XDG_DATA_HOME=str(tmp / "data"),
               XDG_CACHE_HOME=str(tmp / "cache"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    if "PIP_CACHE_DIR" not in os.environ:  # the user's pip cache (HOME moved): wheels already fetched
        env["PIP_CACHE_DIR"] = str(Path.home() / ".cache" / "pip")
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(argv[:4])} ... failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.timeout(900)
def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    env = _clean_env(tmp_path)
    wheels, build, outside = tmp_path / "wheels", tmp_path / "build", tmp_path / "elsewhere"
    outside.mkdir()
    # A build folder of its own, so the checkout's build/ (an editable install's) is neither used nor touched.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheels),
          f"--config-settings=build-dir={build}", str(REPO)], outside, env, timeout=600)
    (wheel,) = wheels.glob("gpudash-*.whl")

    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    py = target / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "--quiet", "--prefer-binary", str(wheel)], outside, env, timeout=600)

    helped = _run([str(target / "bin" / "gpudash"), "--help"], outside, env, timeout=120)
    assert "Usage: gpudash" in helped.stdout and "launch" in helped.stdout

    r = _run([str(py), "-c", COPY], outside, env, timeout=300)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["exact"] is True
    assert max(got["paths"]) > 1  # the multipath scheduler ran, not only the direct path
    for part in ("gpudash", "engine", "lib"):
        where = Path(got[part]).resolve()
        assert where.is_relative_to(target.resolve()), f"{part} loaded from {where}, not the new environment"
        assert not where.is_relative_to(REPO), f"{part} loaded from the checkout: {where}"
