"""libgpudash_preload.so against fake CUDA libraries: the three doors, what is taken and what passes,
stream order, the kill switch, engine failures, fork children, exit, and the live knob block. The checks
themselves run inside the program (tests/preload/preload_doors.c), which reads its own stats block."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from gpudash.engine import EngineConfig

Run = Callable[..., CompletedProcess[str]]


def _passed(out: CompletedProcess[str], scenario: str) -> None:
    assert out.returncode == 0, f"{scenario}: rc={out.returncode}\n{out.stdout}\n{out.stderr}"
    assert f"scenario {scenario} passed" in out.stdout


@pytest.mark.parametrize("scenario", ["doors", "threads", "engine-fails", "knobs", "fork"])
def test_scenario(run_doors: Run, scenario: str) -> None:
    out = run_doors(scenario)
    _passed(out, scenario)
    assert out.stderr == ""  # a working preload says nothing


def test_the_cpu_of_gpudashs_threads_counts_theirs_only_and_finds_one_started_later(run_doors: Run) -> None:
    _passed(run_doors("own-cpu"), "own-cpu")


def test_without_stream_memory_ops_a_host_function_gates_the_stream(run_doors: Run) -> None:
    _passed(run_doors("hostfunc", {"FAKECUDA_NO_MEMOPS": "1"}), "hostfunc")


def test_on_one_gpu_pinned_copies_pass_unless_asked(run_doors: Run) -> None:
    _passed(run_doors("one-gpu", {"FAKECUDA_GPUS": "1"}), "one-gpu")
    _passed(run_doors("one-gpu-always", {"FAKECUDA_GPUS": "1", "GPUDASH_PRELOAD_PINNED": "always"}), "one-gpu-always")


def test_the_engine_starts_at_the_first_copy_and_a_big_copy_waits_for_it(run_doors: Run) -> None:
    out = run_doors("early-start", {"FAKECUDA_RETAIN_DELAY_MS": "400"})
    _passed(out, "early-start")
    assert out.stderr == ""


def test_the_checks_fail_without_the_preload(run_doors: Run) -> None:
    out = run_doors("doors", preload=False)
    assert out.returncode == 1 and "FAILED" in out.stderr  # the stats block is missing


def test_kill_switch_passes_everything_with_one_line(run_doors: Run) -> None:
    out = run_doors("off", {"GPUDASH_PRELOAD": "off"})
    _passed(out, "off")
    assert out.stderr.count("\n") == 1 and "GPUDASH_PRELOAD=off" in out.stderr


def test_an_engine_that_cannot_start_passes_everything_with_one_line(run_doors: Run) -> None:
    out = run_doors("failed", {"GPUDASH_ENGINE_LIB": "/nonexistent/libgpudash_engine.so"})
    _passed(out, "failed")
    assert out.stderr.count("\n") == 1 and "cannot load the engine" in out.stderr


def test_bad_knobs_pass_everything_and_name_the_knob(run_doors: Run) -> None:
    out = run_doors("failed", {"GPUDASH_PRELOAD_KNOBS": "h2d_chunk_bytes=65536,bogus=1"})
    _passed(out, "failed")
    assert out.stderr.count("\n") == 1 and "unknown knob 'bogus'" in out.stderr


def test_exit_passes_through_and_removes_the_blocks(run_doors: Run) -> None:
    out = run_doors("exit")
    _passed(out, "exit")
    assert "exit-copy passed through" in out.stdout
    pid = int(out.stdout.split("pid ")[1].split()[0])
    assert not Path(f"/dev/shm/gpudash-preload-stats-{pid}").exists()
    assert not Path(f"/dev/shm/gpudash-preload-knobs-{pid}").exists()


def test_start_up_knobs_default_to_the_engine_config(run_doors: Run) -> None:
    out = run_doors("defaults", {"GPUDASH_PRELOAD_KNOBS": None})
    _passed(out, "defaults")
    got = dict(line.split("=") for line in out.stdout.splitlines() if "=" in line)
    cfg = EngineConfig()
    for name in ("h2d_chunk_bytes", "d2h_chunk_bytes", "h2d_fallback_bytes", "d2h_fallback_bytes", "outstanding",
                 "h2d_staging_bytes", "d2h_staging_bytes"):
        assert int(got[name]) == getattr(cfg, name), name
    assert int(got["direct_first"]) == int(cfg.direct_first)
    assert int(got["staging_threads"]) == min(16, max(1, len(os.sched_getaffinity(0)) // 2))


def test_a_model_files_bytes_are_taken_from_its_read_only_mapping_and_a_pinned_copy_passes_saying_why(
        run_doors: Run, tmp_path: Path) -> None:
    """On one GPU: tensors that are views of a file's read-only mapping (PROT_READ, private or shared) are
    staged; safetensors 0.8's load_file copies each tensor into a pinned buffer first, and that copy passes
    (only the direct path), counted under "pinned" in the stats block and said so by the trace."""
    out = run_doors("file-source", {"FAKECUDA_GPUS": "1", "GPUDASH_PRELOAD_TRACE": "1", "TMPDIR": str(tmp_path)})
    _passed(out, "file-source")
    lines = out.stderr.splitlines()
    taken = [ln for ln in lines if ln.endswith(": taken")]
    assert len(taken) == 3 and all("src pageable dst device" in ln and "gpudash-file-source-" in ln for ln in taken)
    assert sum(" r--p " in ln for ln in taken) == 2 and sum(" r--s " in ln for ln in taken) == 1
    passed = [ln for ln in lines if "passed:" in ln]
    assert len(passed) == 1 and "src pinned dst device" in passed[0]
    assert passed[0].endswith("passed: pinned, direct path only")
    assert len(lines) == 4  # the 4 KiB copy is below every threshold: no decision, no line
