"""The CLI's words: sub-group --help keeps whole descriptions, `config show` tells the [pools] defaults
truly, `run --stats` on a program that never copies does not alarm, sizes in one unit style, and
`history` names what recorded each session (a bench is not mistaken for a recording) and its end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gpudash import fmt
from gpudash.cli import main
from gpudash.commands.groups import Group
from gpudash.config import Config
from gpudash.store import Store

from cli_helpers import run


def _squeezed(text: str) -> str:
    return "".join(text.split())


def _groups() -> list[str]:
    ctx = main.make_context("gpudash", ["--help"], resilient_parsing=True)
    return [n for n in main.list_commands(ctx) if isinstance(main.get_command(ctx, n), click.Group)]


def test_every_sub_group_lists_its_commands_whole() -> None:
    assert {"config", "llama", "server", "store", "bench"} <= set(_groups())
    ctx = main.make_context("gpudash", ["--help"], resilient_parsing=True)
    assert all(isinstance(main.get_command(ctx, n), Group) for n in _groups())  # a new group too


@pytest.mark.parametrize("group", _groups())
def test_sub_group_help_keeps_each_description_whole(group: str) -> None:
    result = CliRunner().invoke(main, [group, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    listing = result.output.split("Commands:", 1)[1]
    assert "..." not in listing
    ctx = main.make_context("gpudash", [group, "--help"], resilient_parsing=True)
    cmd = main.get_command(ctx, group)
    for name in cmd.list_commands(ctx):
        doc = cmd.get_command(ctx, name).help
        first = doc.split("\n\n")[0].split(". ")[0].rstrip(".")  # click's short help: the first sentence
        assert _squeezed(f"{name}{first}") in _squeezed(listing), (group, name)


def test_config_show_says_the_pools_are_on_by_default() -> None:
    result = CliRunner().invoke(main, ["config", "show"], env={"XDG_CONFIG_HOME": "/nonexistent-gpudash-test"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    at = lines.index("[pools]")
    comment = " ".join(ln.removeprefix("# ") for ln in lines[:at][-3:] if ln.startswith("#"))
    assert "off unless sizes are set" not in result.output
    assert "on by default" in comment and "0 turns that pool off" in comment
    assert f"host_bytes = {64 * 2**20}  # 64 MiB" in lines[at + 1:at + 12]  # bytes in the unit the docs use
    assert "h2d_chunk_bytes = 2810000  # default; 2.68 MiB" in lines


def test_run_stats_of_a_program_that_never_copies_does_not_alarm(tmp_path: Path) -> None:
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text("")
    r = subprocess.run([sys.executable, "-m", "gpudash", "--config", str(cfg), "run", "--stats", "--", "true"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith("gpudash run: true published no engine stats: it made no CUDA host<->device copy"), \
        r.stderr
    assert "GPUDASH_PRELOAD=off, or the preload library did not load" not in r.stderr


def test_knob_sizes_read_in_binary_units() -> None:
    assert [fmt.knob_text(v) for v in (2_810_000, 16 * 2**20, 5_370_000, 8 * 2**30, 4096, 3, True)] == \
        ["2.68 MiB", "16 MiB", "5.12 MiB", "8 GiB", "4 KiB", "3", "True"]
    assert fmt.knob(2_810_000) == "2.81MB"  # a form still takes the exact value back


def test_history_names_a_bench_session_and_an_interrupted_one(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    bench = run(tmp_path, "bench", "engine", "--backend", "sim", "--sizes", "64KiB", "--db", str(db), timeout=300)
    assert bench.returncode == 0, bench.stderr
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with Store.open(db) as store:  # a recording whose writer died: no end, and its pid is gone
        sid = store.begin_session("sim:h200", Config(), note="gpudash record")
        store.db.execute("UPDATE sessions SET pid = ? WHERE id = ?", [gone.pid, sid])
        store.db.conn.commit()
    sessions = json.loads(run(tmp_path, "history", "--db", str(db), "--json").stdout)["sessions"]
    assert [(s["note"], s["state"]) for s in sessions] == [("gpudash bench engine", "closed"),
                                                           ("gpudash record", "interrupted")]
    table = run(tmp_path, "history", "--db", str(db))
    assert table.returncode == 0, table.stderr
    header, bench_row, record_row = table.stdout.splitlines()
    assert header.split()[:7] == ["id", "started", "ended", "duration", "source", "what", "rows"]
    assert "gpudash bench engine" in bench_row and bench_row.split()[5].startswith("sim:")  # ended: a time of day
    for name in ("source", "what", "rows"):  # every column starts where its header does
        at = header.index(name)
        assert bench_row[at - 2:at] == "  " and bench_row[at] != " ", (name, header, bench_row)
    assert record_row.split()[3] == "interrupted" == fmt.session_end(None, "interrupted")
    assert "gpudash record" in record_row
