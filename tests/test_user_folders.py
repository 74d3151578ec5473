"""The test command passes for a user who saved settings: every test runs in config, data, state and cache
folders of its own (tests/conftest.py), so an engine knob saved with `w` in the TUI, a tuned file from
`bench engine --tune` or a recording in the user's data folder changes nothing a test sees (issue 45, 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import platformdirs
import pytest

from gpudash.config import default_config_path, save_engine_knobs
from gpudash.runtime.tuned import save_tuned

REPO = Path(__file__).resolve().parent.parent
MiB = 2**20


def test_each_test_has_folders_of_its_own(own_user_folders: Path) -> None:
    for where in (platformdirs.user_config_dir(), platformdirs.user_data_dir(), platformdirs.user_state_dir(),
                  platformdirs.user_cache_dir(), default_config_path()):
        assert Path(where).is_relative_to(own_user_folders)


def test_a_users_saved_knobs_reach_no_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user whose config holds h2d_chunk_bytes = 4 MiB (as `w` on the Engine tab writes it) and whose
    tuned file holds outstanding = 3 runs a test that prints the defaults: it passes."""
    user = {var: str(tmp_path / var.lower()) for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME")}
    for var, where in user.items():
        monkeypatch.setenv(var, where)
    save_engine_knobs(default_config_path(), {"h2d_chunk_bytes": 4 * MiB})
    save_tuned({"outstanding": 3})
    env = {**os.environ, **user}
    test = "tests/tui/test_bench_engine_output.py::test_bench_engine_prints_knobs_as_a_table"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
