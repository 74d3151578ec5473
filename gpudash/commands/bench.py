"""`gpudash bench ...`: benchmarks that print side-by-side tables (this vs the native baseline)."""

from __future__ import annotations

import click

from gpudash.commands.groups import LazyGroup

BENCHES: dict[str, str] = {
    "engine": "gpudash.commands.bench_engine:bench_engine",
    "overlap": "gpudash.commands.bench_overlap:bench_overlap",
    "share": "gpudash.commands.bench_share:bench_share",
}


@click.group(cls=LazyGroup, lazy=BENCHES)
def bench() -> None:
    """Measure this box: the transfer engine, compute/communication overlap, memory shares."""
