"""`gpudash status` fits the terminal: at 80 columns no line is wider than 80 and no column is dropped,
at 160 the GPU table is one table; columns are named in words. On the sim rigs (the real command) and
on snapshots shaped as NVML reports real GPUs (long names, clock-event reasons, fields it cannot read)."""

from __future__ import annotations

import ctypes
import io
import json
import os
import re
from types import SimpleNamespace

import pynvml
import pytest
from click.testing import CliRunner
from rich.console import Console

from gpudash.cli import main
from gpudash.commands.status import COLUMNS, render
from gpudash.records import GpuProcessSample, GpuSample, HostSample, Snapshot
from gpudash.gpu import nvml

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


def test_at_160_columns_the_gpu_table_is_one_table_in_words() -> None:
    out = _status(160, "--sim", "rtx5080+rtx3090")
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 160
    header = next(ln for ln in lines if ln.startswith("GPU") and "name" in ln)
    assert header.split() == ["GPU", "name", "busy", "memory", "used", "power", "temp", "link", "link", "max",
                              "GPU", "to", "host", "host", "to", "GPU", "SM", "clock", "held", "down", "by",
                              "ECC", "errors", "remapped", "rows"]
    assert not {"GPUs", "PCIe links", "clocks and errors"} & {ln.strip() for ln in lines}  # no group titles
    gpu0 = next(ln for ln in lines if ln.split()[:1] == ["0"])
    assert "RTX 5080" in gpu0 and "gen4 x8" in gpu0 and "of 16.0 GiB" in gpu0 and "MHz" in gpu0
    assert "host: CPU busy" in out


def test_the_gpu_table_is_one_table_when_the_terminal_has_room() -> None:
    out = _render(_nvml_like(), 200)
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("GPU") and "name" in ln)
    assert [name for name in EVERY_COLUMN if name in header] == EVERY_COLUMN
    assert not {"GPUs", "PCIe links", "clocks and errors"} & {ln.strip() for ln in lines}  # no group titles


@pytest.mark.parametrize("width", [80, 120, 160])
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


def _not_supported(*_args, **_kw):
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


@pytest.fixture()
def fake_nvml(monkeypatch):
    """pynvml answering as NVIDIA's NVML API Reference documents each query, for an RTX 5080 and an RTX
    3090 in gen4 x8 slots: power in milliwatts (nvmlDeviceGetPowerUsage), clocks in MHz, memory in bytes,
    link generation and width as integers, clock-event reasons as a bit mask of nvmlClocksThrottleReason*,
    and NVML_ERROR_NOT_SUPPORTED where GeForce cards have no such counter (ECC, remapped rows). Queries
    left out raise NVMLError_Uninitialized, as pynvml does before nvmlInit, which gpudash reads as NA."""
    cards = [("NVIDIA GeForce RTX 5080", 16_303 * 2**20, 15_020 * 2**20, (12, 0), 5, 97, 355_120, 71, 2_617,
              pynvml.nvmlClocksThrottleReasonSwPowerCap | pynvml.nvmlClocksThrottleReasonHwThermalSlowdown),
             ("NVIDIA GeForce RTX 3090", 24_576 * 2**20, 21_112 * 2**20, (8, 6), 4, 88, 341_870, 66, 1_695, 0)]
    handles = [ctypes.c_void_p(0x5000 + i) for i in range(len(cards))]

    def card(h):
        return cards[[x.value for x in handles].index(h.value)]

    answers = {
        "nvmlInit": lambda: None, "nvmlDeviceGetCount": lambda: len(cards),
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetName": lambda h: card(h)[0], "nvmlDeviceGetUUID": lambda h: f"GPU-fake-{h.value:x}",
        "nvmlDeviceGetMemoryInfo": lambda h, version=None: SimpleNamespace(total=card(h)[1], used=card(h)[2],
                                                                           free=card(h)[1] - card(h)[2]),
        "nvmlDeviceGetCudaComputeCapability": lambda h: card(h)[3],
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: 4, "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 8,
        "nvmlDeviceGetGpuMaxPcieLinkGeneration": lambda h: card(h)[4],
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 4, "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 8,
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=card(h)[5], memory=40),
        "nvmlDeviceGetPowerUsage": lambda h: card(h)[6], "nvmlDeviceGetTemperature": lambda h, sensor: card(h)[7],
        "nvmlDeviceGetClockInfo": lambda h, clock: card(h)[8],
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: card(h)[9],
        "nvmlDeviceGetTotalEccErrors": _not_supported, "nvmlDeviceGetRemappedRows": _not_supported,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: (
            [SimpleNamespace(pid=os.getpid(), usedGpuMemory=14_200 * 2**20)] if h.value == handles[0].value else []),
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
    }
    for name, fn in answers.items():
        monkeypatch.setattr(pynvml, name, fn)
    for name, value in (("_initialised", False), ("_init_error", None), ("_closing", False), ("_chosen", {})):
        monkeypatch.setattr(nvml, name, value)
    return cards


@pytest.mark.parametrize("width", [80, 160])
def test_status_through_nvml_fits_and_names_what_nvml_says(fake_nvml, width: int) -> None:
    """The real path (driver found, NvmlSource, the sampler, the layout) over a fake NVML."""
    out = _status(width)
    lines = out.splitlines()
    assert lines[0] == "nvml", out
    assert max(len(ln) for ln in lines) <= width, "\n".join(ln for ln in lines if len(ln) > width)
    flat = _headers(out)
    for name in EVERY_COLUMN:
        assert name in flat, name
    gpu0 = [ln for ln in lines if ln.split()[:1] == ["0"]]
    assert any("97%" in ln and "14.7 GiB of 15.9 GiB" in ln and "355 W" in ln and "71 °C" in ln for ln in gpu0)
    assert any("2617 MHz" in ln and "power cap, hw thermal" in ln for ln in gpu0)  # one line: nothing wraps
    gpu1 = [ln for ln in lines if ln.split()[:1] == ["1"]]
    assert any("1695 MHz" in ln and "nothing" in ln for ln in gpu1)  # mask 0: clocks run free
    assert all("gen4 x8" in ln for ln in lines if re.search(r"gen\d x\d", ln))
    assert "13.9 GiB" in out  # the process's GPU memory


def test_doctor_reads_the_cards_own_link_through_nvml_and_warns(fake_nvml) -> None:
    """nvml_topology over the same fake: NVML's GPU max generation (5 for the RTX 5080) above the link's max
    (4, what card and slot allow together) is a card held back by its slot: a warning, not full speed."""
    from gpudash.advisor.checks import check_link_under_load
    from gpudash.advisor.facts import CpuPlacement, DoctorFacts, LinkLoad
    from gpudash.telemetry.rig import read_topology

    topo = read_topology("nvml")
    assert [(g.card_gen, g.link_gen_max, g.link_width_max) for g in topo.gpus] == [(5, 4, 8), (4, 4, 8)]
    busy = tuple(LinkLoad(g.index, 12.0, 13.7) for g in topo.gpus)
    r = check_link_under_load(DoctorFacts(topology=topo, cpu=CpuPlacement(frozenset({0}), frozenset({0})), busy=busy))
    assert r.status == "warn" and "GPU 0" in r.fix and "GPU 0, 1" not in r.fix
    # the fake has no sysfs entry, so the card's width is unknown and said so
    assert "GPU 0 (NVIDIA GeForce RTX 5080): the card is gen5 x?; its slot allows gen4 x8 at most" in r.evidence
