"""The wheel as a user gets it: built by packaging/build_wheel.py (zig against glibc 2.28, checked and tagged
by auditwheel), then installed into new virtual environments of Python 3.11, 3.12 and 3.13 with no compiler
or CMake reachable (PATH is the environment's bin/ alone, and only wheels are accepted), and run from a
folder outside the checkout with no PYTHONPATH: `gpudash --version`, `gpudash status --json`, `gpudash
deploy rules`, and one copy on the engine's sim backend moving exact bytes, with gpudash, gpudash.engine
and the native library all loaded from the environment. pipx and `uv tool install` install it too.
Dependencies come from pip's cache or index, as any install's do.

A Python that is not on PATH, in pyenv or found by uv makes its case skip, except where
GPUDASH_REQUIRE_PYTHONS=1 (.ci/run), where it fails. About 4 minutes on 2 cores, most of it pip."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHONS = ("3.11", "3.12", "3.13")
TAG = "py3-none-manylinux_2_28_x86_64"

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


def _clean_env(tmp: Path, path: str) -> dict[str, str]:
    """No checkout, no compiler: the user's pip settings and cache, PATH as given, a home of the test's."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GPUDASH_ENGINE_LIB", "VIRTUAL_ENV", "CC", "CXX", "CMAKE_ARGS")}
    env.update(PATH=path, HOME=str(tmp / "home"), XDG_CONFIG_HOME=str(tmp / "config"),
               XDG_DATA_HOME=str(tmp / "data"), XDG_CACHE_HOME=str(tmp / "cache"), XDG_STATE_HOME=str(tmp / "state"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    if "PIP_CACHE_DIR" not in os.environ:  # the user's pip cache (HOME moved): wheels already fetched
        env["PIP_CACHE_DIR"] = str(Path.home() / ".cache" / "pip")
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(argv[:4])} ... failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _interpreter(version: str) -> str | None:
    """A Python `version` interpreter: on PATH, in pyenv, or one uv knows (uv python find)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}"),
                  *sorted(glob.glob(str(pyenv / "versions" / f"{version}.*" / "bin" / f"python{version}")))]
    if shutil.which("uv"):
        found = subprocess.run(["uv", "python", "find", version], capture_output=True, text=True)
        candidates.append(found.stdout.strip() if found.returncode == 0 else None)
    for c in filter(None, candidates):
        r = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                           text=True)
        if r.returncode == 0 and r.stdout.strip() == version:
            return c
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The published wheel, built by the repository's script into the test's own folders."""
    tmp = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, str(REPO / "packaging" / "build_wheel.py"), "--out", str(tmp / "dist"),
                        "--tools", str(tmp / "tools"), "--build-root", str(tmp / "build")],
                       capture_output=True, text=True, timeout=1200, cwd=tmp)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    (built,) = (tmp / "dist").glob("gpudash-*.whl")
    (tmp / "auditwheel-show.txt").write_text(r.stdout)
    return built


@pytest.mark.timeout(1500)
def test_the_wheel_is_one_manylinux_2_28_wheel_for_every_python(wheel: Path) -> None:
    assert wheel.name == f"gpudash-0.1.0-{TAG}.whl"
    shown = (wheel.parent.parent / "auditwheel-show.txt").read_text()
    (floor,) = re.findall(r'consistent with\s+the following platform tag:\s+"manylinux_2_(\d+)_x86_64"', shown)
    assert int(floor) <= 28  # it needs no newer glibc than the tag says
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read("gpudash-0.1.0.dist-info/METADATA").decode()
    assert {"gpudash/engine/libgpudash_engine.so", "gpudash/engine/libgpudash_preload.so",
            "gpudash/deploy/prometheus/gpudash-rules.yml", "gpudash/deploy/grafana/gpudash.json",
            "gpudash/deploy/systemd/gpudash-record.service", "gpudash/deploy/RUNBOOK.md",
            "gpudash/deploy/kubernetes/gpudash.yaml", "gpudash/deploy/kubernetes/gpudash-prometheusrule.yaml"} <= names
    schemas = {f"gpudash/commands/schemas/{p.name}" for p in (REPO / "gpudash" / "commands" / "schemas").glob("*.json")}
    assert schemas and schemas <= names  # each --json output's schema, which its schema_version is read from
    assert "License-Expression: MIT" in meta and "Project-URL: Source," in meta
    assert "Classifier: Programming Language :: Python :: 3.13" in meta and "Requires-Python: >=3.11" in meta


@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", PYTHONS)
def test_the_wheel_installs_and_runs_without_a_compiler(wheel: Path, version: str, tmp_path: Path) -> None:
    python = _interpreter(version)
    if python is None:
        msg = f"no Python {version} here (PATH, pyenv, uv)"
        if os.environ.get("GPUDASH_REQUIRE_PYTHONS") == "1":
            pytest.fail(f"GPUDASH_REQUIRE_PYTHONS=1 but {msg}")
        pytest.skip(msg)
    target, outside = tmp_path / "venv", tmp_path / "elsewhere"
    outside.mkdir()
    _run([python, "-m", "venv", str(target)], outside, _clean_env(tmp_path, "/usr/bin:/bin"), timeout=300)
    env = _clean_env(tmp_path, str(target / "bin"))  # no cc, c++, cmake or make reachable
    assert not any(shutil.which(tool, path=env["PATH"]) for tool in ("cc", "gcc", "c++", "cmake", "make"))
    _run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--only-binary=:all:", str(wheel)],
         outside, env, timeout=600)

    gpudash = str(target / "bin" / "gpudash")
    assert _run([gpudash, "--version"], outside, env, timeout=120).stdout.strip().endswith("0.1.0")
    status = json.loads(_run([gpudash, "status", "--json"], outside, env, timeout=120).stdout)
    assert status and "sim" in json.dumps(status)  # no NVIDIA driver here: the labelled sim rig
    rules = _run([gpudash, "deploy", "rules"], outside, env, timeout=120).stdout
    assert rules == (REPO / "deploy" / "prometheus" / "gpudash-rules.yml").read_text()

    got = json.loads(_run([str(target / "bin" / "python"), "-c", COPY], outside, env, timeout=300).stdout.strip()
                     .splitlines()[-1])
    assert got["exact"] is True
    assert max(got["paths"]) > 1  # the multipath scheduler ran, not only the direct path
    for part in ("gpudash", "engine", "lib"):
        where = Path(got[part]).resolve()
        assert where.is_relative_to(target.resolve()), f"{part} loaded from {where}, not the new environment"
        assert not where.is_relative_to(REPO), f"{part} loaded from the checkout: {where}"


@pytest.mark.timeout(1500)
def test_the_aarch64_wheel_is_cross_built(wheel: Path) -> None:
    """The aarch64 configuration beside it: the same script cross-builds it here (zig), auditwheel tags it."""
    tmp = wheel.parent.parent
    r = subprocess.run([sys.executable, str(REPO / "packaging" / "build_wheel.py"), "--arch", "aarch64",
                        "--out", str(tmp / "dist-arm"), "--tools", str(tmp / "tools"), "--build-root", str(tmp / "build")],
                       capture_output=True, text=True, timeout=1200, cwd=tmp)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    (arm,) = (tmp / "dist-arm").glob("gpudash-*.whl")
    assert arm.name == "gpudash-0.1.0-py3-none-manylinux_2_28_aarch64.whl"
    with zipfile.ZipFile(arm) as z:
        for lib in ("gpudash/engine/libgpudash_engine.so", "gpudash/engine/libgpudash_preload.so"):
            elf = z.read(lib)[:20]
            assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64


@pytest.mark.timeout(900)
def test_pipx_and_uv_tool_install_the_wheel(wheel: Path, tmp_path: Path) -> None:
    tools, outside = tmp_path / "tools", tmp_path / "elsewhere"
    outside.mkdir()
    base = _clean_env(tmp_path, "/usr/bin:/bin")
    _run([sys.executable, "-m", "venv", str(tools)], outside, base, timeout=300)
    _run([str(tools / "bin" / "python"), "-m", "pip", "install", "--quiet", "pipx", "uv"], outside, base, timeout=600)
    env = {**_clean_env(tmp_path, f"{tools / 'bin'}:/usr/bin:/bin"),
           "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(tmp_path / "pipx-bin"),
           "UV_TOOL_DIR": str(tmp_path / "uv-tools"), "UV_TOOL_BIN_DIR": str(tmp_path / "uv-bin"),
           "UV_PYTHON_DOWNLOADS": "never"}
    _run([str(tools / "bin" / "pipx"), "install", "--python", sys.executable, str(wheel)], outside, env, timeout=600)
    _run([str(tools / "bin" / "uv"), "tool", "install", "--python", sys.executable, str(wheel)], outside, env,
         timeout=600)
    for bin_dir in ("pipx-bin", "uv-bin"):
        r = _run([str(tmp_path / bin_dir / "gpudash"), "--version"], outside, env, timeout=120)
        assert r.stdout.strip().endswith("0.1.0"), bin_dir
