"""`gpudash bench engine` prints its knobs as a table, sizes in binary units, not a Python dict
(kept with the TUI tests: both read sizes through gpudash.fmt)."""

from __future__ import annotations

from click.testing import CliRunner

from gpudash.cli import main


def test_bench_engine_prints_knobs_as_a_table() -> None:
    res = CliRunner().invoke(main, ["bench", "engine", "--backend", "sim", "--sizes", "64KiB", "--no-store"])
    assert res.exit_code == 0, res.output
    assert "knobs: {" not in res.output
    lines = res.output.splitlines()
    at = lines.index("knobs:")
    knobs = dict(line.split(maxsplit=1) for line in lines[at + 1:at + 6])
    assert knobs["h2d_chunk_bytes"] == "2.68 MiB" and knobs["outstanding"] == "2"  # sizes in binary units
