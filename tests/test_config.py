"""Config files users get wrong: each problem is one line naming the file, the field and the fix; exit 2."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudash.cli import main
from gpudash.engine.config import KNOB
from gpudash.config import Config, load_config

REPO = Path(__file__).resolve().parents[1]

CASES = {
    "bad_toml": ("[sampling\ninterval_s = 1\n", ["not valid TOML: Expected ']' at the end of a table declaration"]),
    "wrong_types": ('[sampling]\ninterval_s = "fast"\n[store]\nqueue_max = 1.5\n',
                    ["sampling.interval_s: Input should be a valid number",
                     "store.queue_max: Input should be a valid integer"]),
    "unknown_field": ("[sampling]\ninterval = 1\n[bogus]\nx = 1\n",
                      ["sampling.interval: unknown field; remove it or check its spelling",
                       "bogus: unknown field; remove it or check its spelling"]),
    "bad_size": ('[engine]\nh2d_chunk_bytes = "2.81 XB"\n',
                 ["engine.h2d_chunk_bytes: expected a size like '2.81MB', '4MiB' or 1048576, got '2.81 XB'"]),
    "bad_staging_threshold": ('[engine]\nh2d_staging_bytes = 2251799813685248\nd2h_staging_bytes = "4 MiBs"\n',
                              ["engine.h2d_staging_bytes: staging threshold must be between 0 (always stage) and "
                               "2**50 bytes, got 2251799813685248 bytes",
                               "engine.d2h_staging_bytes: expected a size like '2.81MB', '4MiB' or 1048576, "
                               "got '4 MiBs'"]),
    "duplicate_servers": ('[[servers]]\nname = "a"\nmodel = "m.gguf"\n[[servers]]\nname = "a"\nmodel = "n.gguf"\n',
                          ["servers: server names must be unique; repeated: a"]),
    "kind_specific_field": ('[[servers]]\nname = "a"\nmodel = "m.gguf"\ngpu_memory_utilization = 0.5\n'
                            '[[servers]]\nname = "b"\nkind = "vllm"\nmodel = "x"\nsplit_mode = "row"\n',
                            ["servers.0: gpu_memory_utilization not valid for kind 'llama.cpp'; remove it or set kind = 'vllm'",
                             "servers.1: split_mode not valid for kind 'vllm'; remove it or set kind = 'llama.cpp'"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_prints_one_line_per_problem_and_exits_2(tmp_path: Path, case: str) -> None:
    text, expected = CASES[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["--config", str(path), "config", "show"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == len(expected)
    for line, want in zip(lines, expected):
        assert line.startswith(f"gpudash: {path}: "), line
        assert want in line
    assert result.stdout == ""


def test_bad_config_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CASES["wrong_types"][0])
    proc = subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", "--config", str(path),
                           "config", "show"], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 2


def test_missing_explicit_config_file_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--config", str(tmp_path / "nope.toml"), "config", "show"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"gpudash: {tmp_path / 'nope.toml'}: file not found; pass an existing TOML file to --config"


def test_config_show_prints_effective_toml_that_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[sampling]\ninterval_s = 0.25\n[engine]\nh2d_chunk_bytes = "4MiB"\n'
                    '[[servers]]\nname = "a"\nmodel = "m.gguf"\ntensor_split = [2, 3]\n')
    result = CliRunner().invoke(main, ["--config", str(path), "config", "show"])
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.stdout)
    assert shown["sampling"]["interval_s"] == 0.25
    assert shown["engine"]["h2d_chunk_bytes"] == 4 * 2**20
    assert shown["engine"]["d2h_chunk_bytes"] == 5_370_000  # embedded default
    assert (shown["engine"]["h2d_staging_bytes"], shown["engine"]["d2h_staging_bytes"]) == \
        (KNOB["h2d_staging_bytes"].default, KNOB["d2h_staging_bytes"].default)  # the knob table's defaults
    again = tmp_path / "again.toml"
    again.write_text(result.stdout)
    assert load_config(again) == load_config(path)


def test_config_show_without_a_file_prints_the_embedded_defaults(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["config", "show"])
    assert result.exit_code == 0
    assert Config.model_validate(tomllib.loads(result.stdout)) == Config()


def test_config_show_puts_every_fields_documentation_above_it(tmp_path: Path) -> None:
    from gpudash import config as c

    path = tmp_path / "c.toml"
    path.write_text('[keys]\nquit = "ctrl+q"\n[pools]\nshards = { kv = 0.5, "odd key" = 0.25 }\n'
                    '[[servers]]\nname = "a"\nmodel = "m.gguf"\nenv = { HF_HOME = "/x" }\n'
                    '[[servers]]\nname = "b"\nkind = "vllm"\nmodel = "org/m"\n')
    result = CliRunner().invoke(main, ["--config", str(path), "config", "show"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    comments = " ".join(ln.removeprefix("# ") for ln in lines if ln.startswith("# "))
    sections = (c.Config, c.SamplingConfig, c.StoreConfig, c.SimConfig, c.EngineSettings, c.ServerSpec,
                c.ProbeConfig, c.PrometheusConfig, c.LlamaConfig, c.PoolsConfig)
    for section in sections:
        for name, field in section.model_fields.items():
            assert " ".join(field.description.split()) in comments, f"{section.__name__}.{name}"
    maps = ("[keys]", "[pools.shards]", "[servers.env]")  # tables of free-form entries: the table has the doc
    in_map = False
    for prev, line in zip(lines, lines[1:]):  # every value, unset field and table has a comment right above it
        if not line or (in_map and line not in maps) or line.startswith(("#", " ", "]")):
            in_map = in_map and bool(line)
            continue
        in_map = line in maps
        assert prev.startswith("# ") or line == "[[servers]]", (prev, line)
    assert lines[lines.index("# share: unset") - 1].startswith("# Share of each of its GPUs' memory")
    again = tmp_path / "again.toml"
    again.write_text(result.stdout)
    assert load_config(again) == load_config(path)
