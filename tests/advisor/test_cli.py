"""doctor / plan / bench overlap through click: exit codes, --json that parses, one-sentence errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudash.cli import main


def run(*args: str, config: Path | None = None):
    argv = (["--config", str(config)] if config else []) + list(args)
    return CliRunner().invoke(main, argv, catch_exceptions=False)


def test_doctor_json_on_a_sim_rig() -> None:
    r = run("doctor", "--sim", "rtx5080+rtx3090", "--json", "--load-seconds", "0.2")
    data = json.loads(r.stdout)
    assert data["source"] == "sim:rtx5080+rtx3090" and data["sim"] is True
    statuses = {c["check"]: c["status"] for c in data["checks"]}
    assert statuses["link_busy"] == "warn" and statuses["p2p"] == "warn" and statuses["shares"] == "pass"
    assert statuses["llama_archs"] == statuses["llama_builds"] == statuses["nccl_mixed"] == "skip"
    assert "fail" not in statuses.values()
    assert r.exit_code == data["exit_code"] == 0


def test_doctor_text_on_a_sim_rig_skips_with_the_reason_and_exits_0() -> None:
    """The simulated rig's servers run on the CPU: the build checks are SKIP with why, never FAIL."""
    r = run("doctor", "--sim", "rtx5080+rtx3090", "--load-seconds", "0.1")
    lines = r.stdout.splitlines()
    assert r.exit_code == 0, r.stdout
    assert "SKIP  llama.cpp archs against these GPUs' compute capabilities" in lines
    i = lines.index("SKIP  llama.cpp archs against these GPUs' compute capabilities")
    assert lines[i + 1].strip().startswith("simulated rig (sim:rtx5080+rtx3090): its GPUs are modelled")
    assert "WARN  PCIe link speed and width while busy" in lines
    assert any("the card is gen5 x16" in ln and "its slot allows gen4 x8 at most" in ln for ln in lines)
    assert not any(ln.startswith("FAIL") for ln in lines)


def test_doctor_fails_on_overcommitted_shares(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[servers]]\nname = "a"\nkind = "vllm"\nmodel = "m"\ngpus = [0]\nshare = 0.6\n'
                   '[[servers]]\nname = "b"\nkind = "vllm"\nmodel = "m"\ngpus = [0]\nshare = 0.5\n')
    r = run("doctor", "--sim", "h200", "--load-seconds", "0.1", config=cfg)
    assert r.exit_code == 1
    assert "FAIL  Memory shares per GPU (their sum, up to 1)" in r.stdout
    assert "GPU 0: a 0.6 (share) + b 0.5 (share) = 1.10" in r.stdout and "fix: lower `share`" in r.stdout
    assert "simulated rig" in r.stdout.splitlines()[0]


@pytest.mark.parametrize("args", [["--sim", "h200", "--no-sim"], ["--sim", "nosuchrig"]])
def test_doctor_usage_errors_exit_2(args: list[str]) -> None:
    r = run("doctor", *args)
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_plan_json_lands_on_2_to_3() -> None:
    r = run("plan", "--sim", "rtx5080+rtx3090", "--model-gb", "28.7", "--kv-gb", "4", "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["ts"] == "2,3" and data["sim"] is True and data["balance"] == "memory"
    assert data["ratios"][0] == pytest.approx(0.4, abs=0.01)


def test_plan_text_and_time_balance() -> None:
    r = run("plan", "--sim", "rtx5080+rtx3090", "--model-gb", "8", "--balance", "time")
    assert r.exit_code == 0 and "-ts 13,12" in r.stdout and "sim profile" in r.stdout


def test_plan_impossible_is_one_sentence_exit_2() -> None:
    r = run("plan", "--sim", "rtx5080+rtx3090", "--model-gb", "60")
    assert r.exit_code == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "needs 60.0 GB" in r.stderr


def test_plan_without_servers_plans_for_the_demo_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no config file: no servers
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the demo model is written
    r = run("plan", "--sim", "h200")
    assert r.exit_code == 0, r.output
    demo = next((tmp_path / "cache").rglob("demo-*.gguf"))
    assert r.stdout.splitlines()[1] == f"model: the demo model {demo}"
    data = json.loads(run("plan", "--sim", "h200", "--json").stdout)
    from gpudash.launcher.shares import gpu_bytes, model_shape

    shape = model_shape(demo)  # what llama.cpp puts on the GPUs: every tensor but token_embd, kept on the CPU
    assert data["need_bytes"] == gpu_bytes(shape, shape.layers + 1, 0) < demo.stat().st_size
    assert data["model"] == f"the demo model {demo}"


@pytest.mark.parametrize("servers,msg", [
    ('[[servers]]\nname = "v"\nkind = "vllm"\nmodel = "org/m"\n', "no llama.cpp server is configured"),
    ('[[servers]]\nname = "l"\nmodel = "/nonexistent/m.gguf"\n', "server l's model /nonexistent/m.gguf is not a file"),
])
def test_plan_without_a_model_file_exit_2(tmp_path: Path, servers: str, msg: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(servers)
    r = run("plan", "--sim", "h200", config=cfg)
    assert r.exit_code == 2 and r.stdout == "" and msg in r.stderr and "--model-gb" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bench_overlap_json_and_table() -> None:
    r = run("bench", "overlap", "--sim", "rtx5080+rtx3090", "--tp", "1", "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["sim"] is True and data["shape"]["tp"] == 1 and len(data["rows"]) == 2
    row = data["rows"][0]
    assert row["source"] == "sim profile" and row["achieved_s"] is None
    assert row["result"]["hides"] is False and row["result"]["depth"] > 1
    table = run("bench", "overlap", "--sim", "8xh20", "--tokens", "512")
    assert table.exit_code == 0 and "SIM: arithmetic" in table.stdout
    assert len([ln for ln in table.stdout.splitlines() if ln[:1].isdigit()]) == 8


@pytest.mark.parametrize("args,msg", [(["--sim", "h200", "--tp", "2"], "needs 2 GPUs"),
                                      (["--sim", "8xh20", "--hidden", "100", "--tp", "8"], "divide by tp")])
def test_bench_overlap_bad_input_exit_2(args: list[str], msg: str) -> None:
    r = run("bench", "overlap", *args)
    assert r.exit_code == 2 and msg in r.stderr and "Traceback" not in r.output


def test_plan_takes_the_model_size_from_the_configured_gguf(tmp_path: Path) -> None:
    model = tmp_path / "big.gguf"
    with model.open("wb") as f:  # sparse: 20 GB of size, no disk
        f.truncate(20 * 10**9)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "l"\nmodel = "{model}"\n')
    r = run("plan", "--sim", "rtx5080+rtx3090", "--json", config=cfg)
    assert r.exit_code == 0 and json.loads(r.stdout)["need_bytes"] == 20 * 10**9
    assert json.loads(r.stdout)["model"] == f"server l's model {model}"
    text = run("plan", "--sim", "rtx5080+rtx3090", config=cfg)
    assert f"model: server l's model {model}" in text.stdout.splitlines()
    sized = run("plan", "--sim", "rtx5080+rtx3090", "--model-gb", "8", config=cfg)
    assert "model: --model-gb 8" in sized.stdout.splitlines()


def test_doctor_text_shows_the_p2p_matrix_and_the_upi_ceiling() -> None:
    r = run("doctor", "--sim", "8xh20", "--load-seconds", "0.1")
    lines = r.stdout.splitlines()
    assert lines[0] == "gpudash doctor [sim:8xh20 (simulated rig, not real hardware)]"
    assert any(ln.split() == ["GPU7", "OK", "OK", "OK", "OK", "OK", "OK", "OK", "X"] for ln in lines)
    assert "WARN  GPUs copying across NUMA nodes (up to 6 keep full speed)" in r.stdout
    assert r.exit_code == (1 if any(ln.startswith("FAIL") for ln in lines) else 0)
