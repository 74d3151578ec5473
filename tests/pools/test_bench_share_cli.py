"""`gpudash bench share` as a real process: usage errors exit 2 in one sentence; with --cpu the
re-launch + probe loop runs against a real llama-server on a tiny generated model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.gpu.nvml import driver_available

REPO = Path(__file__).resolve().parents[2]


def run(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", "--config",
                           str(tmp / "cfg.toml"), "bench", "share", *args],
                          capture_output=True, text=True, env=env, cwd=tmp, timeout=300)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    model = write_demo_model(tmp_path / "m.gguf", DemoModelShape(layers=2, embedding=128, heads=4, heads_kv=4,
                                                                 feed_forward=256, context=2048))
    (tmp_path / "cfg.toml").write_text(
        f'[[servers]]\nname = "small"\nmodel = "{model}"\nctx_size = 2048\nparallel = 2\nhealth_timeout_s = 60\n')
    return tmp_path


@pytest.mark.parametrize("args,message", [
    (("nope", "--cpu"), "no server named 'nope' in the config (configured: small)"),
    (("small", "--shares", "1.0,x", "--cpu"), "--shares item 'x' is not a number"),
    (("small", "--shares", "0", "--cpu"), "--shares item 0 is outside (0, 1]"),
])
def test_usage_errors(config: Path, args: tuple[str, ...], message: str) -> None:
    r = run(config, *args)
    assert r.returncode == 2 and message in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


@pytest.mark.skipif(driver_available() is None, reason="this machine has a GPU; the no-GPU refusal cannot show")
def test_no_gpu_is_one_sentence(config: Path) -> None:
    r = run(config, "small")
    assert r.returncode == 2 and "this machine has no NVIDIA GPU" in r.stderr and "--cpu" in r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.llama
def test_cpu_loop_relaunches_and_probes(config: Path, llama_server: str) -> None:
    r = run(config, "small", "--shares", "1.0,0.4", "--cpu", "--requests", "4", "--max-tokens", "8",
            "--prompt-words", "32", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["where"] == "CPU" and [row["share"] for row in out["rows"]] == [1.0, 0.4]
    for row in out["rows"]:
        assert row["error"] is None and row["failed"] == 0 and row["requests"] == 4
        assert row["tokens_per_s"] > 0 and row["ttft_median_ms"] > 0
        assert row["flags"].startswith("-ngl 0")


def test_spec_at_carries_the_share(config: Path) -> None:
    from gpudash.commands.bench_share import spec_at
    from gpudash.config import ServerSpec

    llama = ServerSpec(name="small", model=str(config / "m.gguf"), ctx_size=2048)
    new, flags, budget = spec_at(llama, 0.3, {0: 16 << 30, 1: 8 << 30})
    assert budget == int(0.3 * (16 << 30) + 0.3 * (8 << 30))
    assert flags == "-ngl 3 -c 2048" and (new.n_gpu_layers, new.ctx_size, new.share) == (3, 2048, 0.3)
    vllm = ServerSpec(name="v", kind="vllm", model="m", gpus=[1], gpu_memory_utilization=0.9)
    new, flags, budget = spec_at(vllm, 0.5, {0: 16 << 30, 1: 8 << 30})
    assert flags == "--gpu-memory-utilization 0.5" and new.gpu_memory_utilization == 0.5 and budget == 4 << 30
    cpu, flags, budget = spec_at(llama, 0.5, {})
    assert budget is None and cpu.n_gpu_layers == 0 and cpu.env["CUDA_VISIBLE_DEVICES"] == ""
