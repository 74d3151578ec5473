"""A tuning stored for this machine fills the [engine] knobs the config file leaves unset, and
`config show` says where each knob's value came from."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudash.engine.config import KNOB
from gpudash.cli import main
from gpudash.config import Config, validate
from gpudash.runtime.tuned import load_tuned, machine_identity, save_tuned, tuned_path, with_tuned

MiB = 2**20


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


def test_tuned_values_fill_only_what_the_config_leaves_unset(home: Path) -> None:
    path = save_tuned({"staging_threads": 12, "h2d_chunk_bytes": 4 * MiB}, "box")
    cfg = with_tuned(validate({"engine": {"h2d_chunk_bytes": "8MiB"}}), "box")
    assert cfg.engine.staging_threads == 12 and cfg.engine.h2d_chunk_bytes == 8 * MiB
    assert cfg.engine.origin("staging_threads") == f"tuned ({path})"
    assert cfg.engine.origin("h2d_chunk_bytes") == "config"
    assert cfg.engine.origin("outstanding") == "default" and cfg.engine.outstanding == KNOB["outstanding"].default


def test_another_machines_tuning_is_not_used(home: Path) -> None:
    save_tuned({"staging_threads": 12}, "other box")
    assert load_tuned("box") is None
    assert with_tuned(Config(), "box") == Config()
    # a file whose name matches but whose machine line does not (copied from elsewhere) is ignored too
    tuned_path("other box").rename(tuned_path("box"))
    assert load_tuned("box") is None


def test_no_tuned_file_means_no_gpu_query(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> str:
        raise AssertionError("machine_identity must not run without a tuned file")

    monkeypatch.setattr("gpudash.runtime.tuned.machine_identity", boom)
    assert load_tuned() is None


def test_machine_identity_names_the_host() -> None:
    import socket

    assert machine_identity().startswith(socket.gethostname() + "; ")


def test_config_show_says_where_each_engine_knob_came_from(home: Path) -> None:
    path = save_tuned({"staging_threads": 7}, machine_identity())
    conf = home / "c.toml"
    conf.write_text('[engine]\noutstanding = 3\n[sampling]\ninterval_s = 2.0\n')
    res = CliRunner().invoke(main, ["--config", str(conf), "config", "show"])
    assert res.exit_code == 0, res.output
    assert "outstanding = 3  # config" in res.stdout
    assert f"staging_threads = 7  # tuned ({path})" in res.stdout
    assert "d2h_chunk_bytes = 5370000  # default" in res.stdout
    assert "# Chunks a path may have in flight at once; 2 is what the MMA multipath-transfer paper found best." \
        in res.stdout  # the knob's doc
    shown = tomllib.loads(res.stdout)
    assert shown["engine"]["staging_threads"] == 7 and shown["sampling"]["interval_s"] == 2.0
