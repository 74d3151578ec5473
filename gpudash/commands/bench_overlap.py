"""`gpudash bench overlap`: per GPU, one layer's T_compute against its T_comm, whether deferring the
communication by one layer hides it, the depth that would, and memory-bandwidth utilisation; on real
GPUs the overlap is also run (achieved against ideal). Sim rigs print arithmetic, labelled SIM."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from gpudash import fmt
from gpudash.commands.common import pass_config, resolve_rig, sim_options, usage_error
from gpudash.commands.json_out import emit
from gpudash.commands.output import console, echo_fitted, fitted_tables, plain_table, print_tables
from gpudash.config import Config
from gpudash.labels import is_sim_label

if TYPE_CHECKING:
    from gpudash.advisor.baseline import OverlapRow
    from gpudash.advisor.overlap import LayerShape


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3f}"


# The table's columns in groups, each table led by the GPU: one table where the terminal is wide enough,
# else the fewest tables of whole groups that fit (one a group at 80 columns).
GROUPS: dict[str, tuple[str, ...]] = {
    "compute against communication": ("T_compute ms", "T_comm ms", "hides", "depth"),
    "layer time": ("serial ms", "ideal ms", "achieved ms", "ach/ideal"),
    "memory bandwidth and the communication": ("BW serial", "BW ideal", "comm"),
}
LEGEND = ("hides: T_comm < T_compute, so deferring communication by one layer hides it; depth: layers to defer by "
          "so it hides; serial: compute then communicate; ideal: max of the two (fully overlapped); achieved: "
          "measured with both running; BW: weight bytes read / (layer time x memory bandwidth)")


def _cells(r: OverlapRow) -> dict[str, str]:
    o = r.result
    return {"T_compute ms": _ms(o.t_compute_s), "T_comm ms": _ms(o.t_comm_s), "hides": "yes" if o.hides else "no",
            "depth": str(o.depth), "serial ms": _ms(o.t_serial_s), "ideal ms": _ms(o.t_overlapped_s),
            "achieved ms": _ms(r.achieved_s),
            "ach/ideal": f"{r.achieved_s / o.t_overlapped_s:.2f}" if r.achieved_s else "n/a",
            "BW serial": f"{o.bw_util_serial:.0%}", "BW ideal": f"{o.bw_util_overlapped:.0%}",
            "comm": escape(f"{r.comm} ({r.comm_gbps:.1f} GB/s)")}


def _table(rows: list[OverlapRow], groups: Sequence[str]) -> Table:
    table = plain_table(title=" and ".join(groups) if len(groups) < len(GROUPS) else None)
    table.add_column("GPU", no_wrap=True)
    names = [n for g in groups for n in GROUPS[g]]
    for name in names:
        wraps = name == "comm"
        table.add_column(name, justify="left" if wraps else "right", no_wrap=not wraps, min_width=28 if wraps else None)
    for r in rows:
        cells = _cells(r)
        table.add_row(str(r.gpu), *(cells[n] for n in names))
    return table


def render(source: str, shape: LayerShape, rows: list[OverlapRow]) -> None:
    """A side-by-side table (serial vs overlapped, ideal vs achieved) that fits the terminal, the lines
    around it wrapped to its width (piped: one line each)."""
    sim = is_sim_label(source)
    head = (f"gpudash bench overlap [{source}]"
            + (" SIM: arithmetic over the profile's rates, not a GPU measurement" if sim else ""))
    layer = (f"layer: hidden {shape.hidden}, ffn {shape.ffn}, tokens {shape.tokens}, tp {shape.tp}, fp16: "
             f"{fmt.size(shape.weight_bytes)} weights and {shape.flops / 1e9:.2f} GFLOP per GPU")
    echo_fitted([head, layer, ""], "  ")
    out = console()
    print_tables(out, fitted_tables(out, tuple(GROUPS), lambda groups: _table(rows, groups)))
    echo_fitted(["", LEGEND, *(["achieved: n/a on a sim rig (nothing computes); run on a GPU for the measured "
                                "overlap"] if sim else [])], "  ")


@click.command("overlap")
@sim_options
@click.option("--hidden", type=click.IntRange(min=64), default=4096, show_default=True, help="Model hidden size.")
@click.option("--ffn", type=click.IntRange(min=64), default=14336, show_default=True, help="MLP intermediate size.")
@click.option("--tokens", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tokens per forward pass (1: decode; more: prefill or a batch).")
@click.option("--tp", type=click.IntRange(min=1, max=8), default=None,
              help="Tensor-parallel GPUs (all-reduce per layer); 1: the layer's weights cross the host link. "
                   "Default: every GPU of the box.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the rows as JSON.")
@pass_config
def bench_overlap(cfg: Config, sim: str | None, no_sim: bool, hidden: int, ffn: int, tokens: int,
                  tp: int | None, as_json: bool) -> None:
    """Can one layer's communication hide behind its compute? T_compute vs T_comm per GPU."""
    from gpudash.advisor.baseline import measured_baseline, sim_baseline
    from gpudash.advisor.overlap import LayerShape
    from gpudash.advisor.rates import RatesUnavailable

    rig = resolve_rig(cfg, sim, no_sim, quiet=as_json)
    source = rig.label
    topo = rig.topology()
    try:
        shape = LayerShape(hidden, ffn, tokens, tp or len(topo.gpus))
        if topo.is_sim:
            rows = sim_baseline(topo, shape)
        else:
            with rig.make_engine(cfg) as engine:
                rows = measured_baseline(topo, shape, engine)
    except (ValueError, RatesUnavailable) as err:
        usage_error(str(err))
    if as_json:
        emit("bench-overlap", {"source": source, "sim": topo.is_sim, "shape": dataclasses.asdict(shape),
                               "rows": [dataclasses.asdict(r) for r in rows]})
    else:
        render(source, shape, rows)
