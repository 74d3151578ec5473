"""`gpudash bench overlap`: per GPU, one layer's T_compute against its T_comm, whether deferring the
communication by one layer hides it, the depth that would, and memory-bandwidth utilisation; on real
GPUs the overlap is also run (achieved against ideal). Sim rigs print arithmetic, labelled SIM."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import click

from gpudash import fmt
from gpudash.commands.common import pass_config, resolve_rig, sim_options, usage_error
from gpudash.config import Config
from gpudash.labels import is_sim_label

if TYPE_CHECKING:
    from gpudash.advisor.baseline import OverlapRow
    from gpudash.advisor.overlap import LayerShape


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3f}"


def render(source: str, shape: LayerShape, rows: list[OverlapRow]) -> str:
    """A side-by-side table: serial vs overlapped, ideal vs achieved."""
    sim = is_sim_label(source)
    head = (f"gpudash bench overlap [{source}]"
            + (" SIM: arithmetic over the profile's rates, not a GPU measurement" if sim else ""))
    layer = (f"layer: hidden {shape.hidden}, ffn {shape.ffn}, tokens {shape.tokens}, tp {shape.tp}, fp16: "
             f"{fmt.size(shape.weight_bytes)} weights and {shape.flops / 1e9:.2f} GFLOP per GPU")
    cols = (f"{'GPU':<4}{'T_compute ms':>13}{'T_comm ms':>11}{'hides':>7}{'depth':>7}{'serial ms':>11}"
            f"{'ideal ms':>10}{'achieved ms':>13}{'ach/ideal':>10}{'BW serial':>11}{'BW ideal':>10}  comm")
    out = [head, layer, "", cols]
    for r in rows:
        o = r.result
        ratio = f"{r.achieved_s / o.t_overlapped_s:.2f}" if r.achieved_s else "n/a"
        out.append(f"{r.gpu:<4}{_ms(o.t_compute_s):>13}{_ms(o.t_comm_s):>11}{'yes' if o.hides else 'no':>7}"
                   f"{o.depth:>7}{_ms(o.t_serial_s):>11}{_ms(o.t_overlapped_s):>10}{_ms(r.achieved_s):>13}"
                   f"{ratio:>10}{o.bw_util_serial:>11.0%}{o.bw_util_overlapped:>10.0%}  {r.comm} ({r.comm_gbps:.1f} GB/s)")
    out += ["", "hides: T_comm < T_compute, so deferring communication by one layer hides it; depth: layers "
                "to defer by so it hides; serial: compute then communicate; ideal: max of the two (fully overlapped); "
                "achieved: measured with both running; BW: weight bytes read / (layer time x memory bandwidth)"]
    if sim:
        out.append("achieved: n/a on a sim rig (nothing computes); run on a GPU for the measured overlap")
    return "\n".join(out)


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
        click.echo(json.dumps({"source": source, "sim": topo.is_sim, "shape": dataclasses.asdict(shape),
                               "rows": [dataclasses.asdict(r) for r in rows]}, indent=2))
    else:
        click.echo(render(source, shape, rows))
