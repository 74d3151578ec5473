"""Every `--json` output carries `schema_version` first and is valid under the JSON Schema the package ships
for it (gpudash/commands/schemas/<output>.json, Draft 2020-12), checked here against real output of each
command as a user runs it: a sim rig, a real SQLite file, the vLLM double as the probe's server, a real
llama-server for `bench share`. `fleet` is checked against a real Prometheus in tests/fleet/test_fleet_json.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import jsonschema
import pytest

from gpudash.commands.json_out import OUTPUTS, schema_path, schema_version
from gpudash.launcher.health import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent / "cli"))
from cli_helpers import run  # noqa: E402
from launcher_helpers import started_outside  # noqa: E402

DOUBLE = Path(__file__).resolve().parent / "doubles" / "vllm_double.py"


def valid(output: str, proc: subprocess.CompletedProcess) -> dict:
    """The document `proc` printed, after checking it against `output`'s schema."""
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert next(iter(doc)) == "schema_version" and doc["schema_version"] == schema_version(output)
    jsonschema.Draft202012Validator(json.loads(schema_path(output).read_text())).validate(doc)
    return doc


def test_every_output_has_a_schema_that_is_one() -> None:
    for output in OUTPUTS:
        schema = json.loads(schema_path(output).read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["required"][0] == "schema_version" and schema["properties"]["schema_version"]["const"] >= 1
    assert sorted(p.stem for p in schema_path("status").parent.glob("*.json")) == sorted(OUTPUTS)


def test_status_doctor_plan_and_the_benches_on_a_sim_rig(tmp_path: Path) -> None:
    assert valid("status", run(tmp_path, "status", "--json", "--sim", "8xh20"))["gpus"]
    doctor = run(tmp_path, "doctor", "--json", "--sim", "h200")
    doctor.returncode = 0 if doctor.returncode in (0, 1) else doctor.returncode  # 1: a check warns
    assert valid("doctor", doctor)["checks"]
    assert valid("plan", run(tmp_path, "plan", "--json", "--sim", "rtx5080+rtx3090", "--model-gb", "8"))["shares"]
    assert valid("bench-overlap", run(tmp_path, "bench", "overlap", "--json", "--sim", "8xh20", timeout=300))["rows"]
    engine = run(tmp_path, "bench", "engine", "--json", "--backend", "sim", "--profile", "h200", "--sizes", "64KiB",
                 timeout=300)
    assert valid("bench-engine", engine)["rows"]


def test_history_of_a_recorded_session(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    assert run(tmp_path, "record", "--sim", "h200", "--duration", "1", "--quiet", "--db", str(db)).returncode == 0
    (session,) = valid("history", run(tmp_path, "history", "--json", "--db", str(db)))["sessions"]
    assert session["source"] == "sim:h200"


def test_probe_against_the_vllm_double(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with contextmanager(started_outside)([sys.executable, str(DOUBLE), "serve", "tiny", "--host", "127.0.0.1", "--port", str(port)],
                         url):
        doc = valid("probe", run(tmp_path, "probe", url, "--requests", "2", "--json", timeout=120))
    assert len(doc["requests"]) == 2


@pytest.mark.llama
def test_bench_share_against_a_real_llama_server(tmp_path: Path, llama_server: str) -> None:
    from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model

    model = write_demo_model(tmp_path / "m.gguf", DemoModelShape(layers=2, embedding=128, heads=4, heads_kv=4,
                                                                 feed_forward=256, context=2048))
    (tmp_path / "cfg.toml").write_text(f'[[servers]]\nname = "small"\nmodel = "{model}"\nctx_size = 2048\n'
                                       'parallel = 2\nhealth_timeout_s = 60\n')
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "gpudash", "--config", str(tmp_path / "cfg.toml"), "bench", "share",
                           "small", "--shares", "1.0", "--cpu", "--requests", "2", "--max-tokens", "4",
                           "--prompt-words", "16", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert valid("bench-share", proc)["rows"]
