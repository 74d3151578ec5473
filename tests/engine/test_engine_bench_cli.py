"""The bench/autotune code paths on the sim backend: the CLI table (labelled SIM, recorded in the store),
autotune finding knobs on a multipath rig, and the per-machine store of a tuning."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudash.engine import EngineConfig, TransferEngine
from gpudash.engine.autotune import CHUNKS, tune
from gpudash.cli import main
from gpudash.commands.bench_engine import _store_tuned
from gpudash.config import ConfigError
from gpudash.runtime.tuned import save_tuned


def test_bench_cli_prints_a_sim_labelled_table_and_records_it(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    res = CliRunner().invoke(main, ["bench", "engine", "--backend", "sim", "--profile", "h200", "--sizes", "64KiB",
                                    "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "SIM rig h200" in res.output and "sim single-path" in res.output
    assert res.output.count("64 KiB") == 6  # h2d/d2h x pinned, one-shot, reused
    assert "relays: none on SIM h200: one GPU" in res.output and "recorded as session" in res.output
    from gpudash.store import Store

    store = Store.open(db)
    sid = store.resolve_session("latest")
    events = list(store.rows(sid, "events"))
    store.close()
    assert len(events) == 6 and all(e["kind"] == "bench.engine" for e in events)


def test_bench_cli_json_and_bad_sizes(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["bench", "engine", "--backend", "sim", "--profile", "8xh20", "--sizes", "4KiB",
                                    "--json", "--no-store"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["sim"] is True and len(out["rows"]) == 6 and out["relays"]["percent"] > 0
    bad = CliRunner().invoke(main, ["bench", "engine", "--backend", "sim", "--sizes", "lots"])
    assert bad.exit_code == 2 and "--sizes" in bad.output


def test_autotune_on_a_multipath_rig() -> None:
    with TransferEngine(EngineConfig(backend="sim", profile="8xh20", sim_time_scale=30.0)) as eng:
        before = eng.knobs()
        res = tune(eng, size=16 * 2**20)
        assert eng.knobs() == before  # tune restores the knobs it swept
    assert set(res.knobs) == {"h2d_chunk_bytes", "d2h_chunk_bytes", "h2d_fallback_bytes", "d2h_fallback_bytes"}
    assert res.knobs["h2d_chunk_bytes"] in CHUNKS and res.knobs["d2h_chunk_bytes"] in CHUNKS
    assert 0 < res.knobs["h2d_fallback_bytes"] <= 16 * 2**20 or res.knobs["h2d_fallback_bytes"] == 2**50
    assert any(what == "h2d multipath/single" for what, _v, _r in res.table)
    assert "the sim does not model the pageable-memory penalty; *_staging_bytes unchanged" in res.notes


def test_tuned_knobs_are_stored_per_machine_merged_and_validated(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = save_tuned({"outstanding": 3}, "box; driver 1; GPU-a")
    save_tuned({"h2d_chunk_bytes": 4 * 2**20, "staging_threads": 12}, "box; driver 1; GPU-a")
    data = tomllib.loads(path.read_text())
    assert data["machine"] == "box; driver 1; GPU-a"
    assert data["engine"] == {"outstanding": 3, "h2d_chunk_bytes": 4 * 2**20, "staging_threads": 12}
    with pytest.raises(ConfigError):
        save_tuned({"staging_threads": 999}, "box; driver 1; GPU-a")
    assert tomllib.loads(path.read_text())["engine"]["staging_threads"] == 12  # bad result never written
    assert save_tuned({"outstanding": 4}, "box; driver 2; GPU-a") != path  # a new driver is a new machine


def test_a_sim_tune_is_shown_but_not_stored(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    said = _store_tuned("sim", {"outstanding": 3})
    assert said == "not stored: a sim rig's tuning says nothing about this machine"
    assert not (tmp_path / "gpudash" / "tuned").exists()
