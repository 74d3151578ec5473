"""`gpudash status`: the one-shot view for scripts and ssh, on a sim rig (labelled as such)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gpudash.cli import main


def test_status_prints_the_gpus_links_and_label_once() -> None:
    res = CliRunner().invoke(main, ["status", "--sim", "rtx5080+rtx3090", "--window", "0.1"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "sim:rtx5080+rtx3090  (simulated rig, not real GPUs)" in out
    assert "RTX 5080" in out and "RTX 3090" in out and "gen4 x8" in out
    assert "host: CPU busy" in out


def test_status_json_is_one_object_for_scripts() -> None:
    res = CliRunner().invoke(main, ["status", "--sim", "8xh20", "--window", "0.1", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["sim"] is True and doc["source"] == "sim:8xh20"
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    assert all(g["link_gen"] == 5 and g["mem_total"] > 0 for g in doc["gpus"])


def test_status_refuses_contradicting_flags() -> None:
    res = CliRunner().invoke(main, ["status", "--sim", "h200", "--no-sim"])
    assert res.exit_code == 2 and "contradict" in res.output
