"""`gpudash status` fits the terminal: at 80 columns no line is wider than 80 and no column is dropped,
at 160 the GPU table is one table; columns are named in words. On the sim rigs (the real command) and
on snapshots shaped as NVML reports real GPUs (long names, clock-event reasons, fields it cannot read)."""

from __future__ import annotations

import io
import json
import re

import pytest
from click.testing import CliRunner
from rich.console import Console

from gpudash.cli import main
from gpudash.commands.status import COLUMNS, render
from gpudash.records import GpuProcessSample, GpuSample, HostSample, Snapshot

EVERY_COLUMN = [name for names in COLUMNS.values() for name in names]


def _status(width: int, *args: str) -> str:
    res = CliRunner().invoke(main, ["status", "--window", "0.1", *args], env={"COLUMNS": str(width)})
    assert res.exit_code == 0, res.output
    return res.stdout


def _nvml_like() -> Snapshot:
    """Eight H200s as NVML reports them on a busy box: one GPU held down by power and thermal limits, one
    whose link trained down under load, one that cannot report clocks, ECC or its link (NA)."""
    gpus = []
    for i in range(8):
        gpus.append(GpuSample(
            1.0, i, f"GPU-{i}", "NVIDIA H200 NVL", util_pct=97.0, mem_used=139_000 * 2**20, mem_total=143_771 * 2**20,
            power_w=598.4, temp_c=71.0, sm_clock_mhz=1980, pcie_tx_bps=21.2e9 if i == 3 else 51.2e9, pcie_rx_bps=3.1e9,
            link_gen=5, link_width=8 if i == 3 else 16, link_gen_max=5, link_width_max=16,
            throttle="power cap,hw thermal" if i == 1 else "none", ecc_uncorrected=0, remapped_rows=0))
    gpus[5] = GpuSample(1.0, 5, "GPU-5", "NVIDIA H200 NVL", util_pct=None, mem_used=None, mem_total=None)
    procs = tuple(GpuProcessSample(1.0, i, 4000 + i, 120 * 2**30, "llama-server", "qwen-72b-instruct-q4", 88.0)
                  for i in range(8))
    return Snapshot(1.0, 1, "nvml", gpus=tuple(gpus), gpu_processes=procs,
                    host=HostSample(1.0, 35.0, 400 * 2**30, 2048 * 2**30))


def _render(snap: Snapshot, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, highlight=False, color_system=None)
    render(snap, console)
    return console.file.getvalue()


def _headers(out: str) -> str:
    return " ".join(out.split())


@pytest.mark.parametrize("profile", ["rtx5080+rtx3090", "8xh20", "h200"])
def test_at_80_columns_nothing_is_wider_and_nothing_is_dropped(profile: str) -> None:
    out = _status(80, "--sim", profile)
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 80, "\n".join(ln for ln in lines if len(ln) > 80)
    assert f"sim:{profile}  (simulated rig, not real GPUs)" in lines[0]
    flat = _headers(out)
    for name in EVERY_COLUMN:
        assert name in flat, name
    n = {"rtx5080+rtx3090": 2, "8xh20": 8, "h200": 1}[profile]
    for title in ("GPUs", "PCIe links", "clocks and errors"):  # one table a group, each row one GPU
        assert title in [ln.strip() for ln in lines]
    rows = [ln for ln in lines if ln.split()[:1] and ln.split()[0].isdigit() and re.search(r"gen\d x\d", ln)]
    assert len(rows) == n  # the PCIe links table: one line per GPU, no wrapping
    assert "SM clock (held by)" not in out and "(NA)" not in out


def test_at_160_columns_the_tables_use_the_room_and_name_columns_in_words() -> None:
    out = _status(160, "--sim", "rtx5080+rtx3090")
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 160
    assert max(len(ln.rstrip()) for ln in lines) > 100  # wider than the 80-column layout
    assert "GPUs and PCIe links" in [ln.strip() for ln in lines]  # two groups side by side
    header = next(ln for ln in lines if ln.startswith("GPU") and "name" in ln)
    assert header.split() == ["GPU", "name", "busy", "memory", "used", "power", "temp", "link", "link", "max",
                              "GPU", "to", "host", "host", "to", "GPU"]
    gpu0 = next(ln for ln in lines if ln.split()[:1] == ["0"])
    assert "GeForce RTX 5080" in gpu0 and "gen4 x8" in gpu0 and "of 16.0 GiB" in gpu0
    assert "host: CPU busy" in out


def test_the_gpu_table_is_one_table_when_the_terminal_has_room() -> None:
    out = _render(_nvml_like(), 200)
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("GPU") and "name" in ln)
    assert [name for name in EVERY_COLUMN if name in header] == EVERY_COLUMN
    assert not {"GPUs", "PCIe links", "clocks and errors"} & {ln.strip() for ln in lines}  # no group titles


@pytest.mark.parametrize("width", [80, 160])
def test_nvml_shaped_rows_fit_and_say_what_they_mean(width: int) -> None:
    out = _render(_nvml_like(), width)
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= width, "\n".join(ln for ln in lines if len(ln) > width)
    assert lines[0] == "nvml" and "simulated" not in out
    flat = _headers(out)
    for name in EVERY_COLUMN:
        assert name in flat, name
    assert "power cap, hw thermal" in out  # clock-event reasons in words
    assert "nothing" in out  # clocks running free ("none" from NVML)
    assert "gen5 x8 LOW" in out  # trained below max while busy
    gpu5 = [ln for ln in lines if ln.split()[:1] == ["5"]]
    assert gpu5 and all("0 MHz" not in ln and " 0%" not in ln for ln in gpu5)  # NA is a dash, never zero
    assert any("—" in ln for ln in gpu5)
    assert not any(bad in ln for bad in ("— —", "— of —", "gen?") for ln in gpu5)  # one dash for what is unknown
    assert "qwen-72b-instruct" in out and "120.0 GiB" in out


def test_status_json_keeps_its_keys() -> None:
    res = CliRunner().invoke(main, ["status", "--sim", "h200", "--window", "0.1", "--json"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {"source", "sim", "ts", "gpus", "gpu_processes", "host", "errors"} <= set(doc)  # extended, never renamed
    assert {"util_pct", "sm_clock_mhz", "throttle", "link_gen", "link_width_max", "pcie_tx_bps"} <= set(doc["gpus"][0])
