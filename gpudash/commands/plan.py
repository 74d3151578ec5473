"""`gpudash plan`: the llama.cpp `-ts` split for the GPUs present, balancing memory or time, and why.
Exit code 0 with a plan, 2 when the model cannot be placed or the input is wrong (one sentence)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import click

from gpudash.commands.common import pass_config, resolve_rig, sim_options, usage_error
from gpudash.commands.json_out import emit
from gpudash.commands.output import echo_fitted
from gpudash.config import Config
from gpudash.labels import is_sim_label

if TYPE_CHECKING:
    from pathlib import Path

    from gpudash.advisor.planner import SplitPlan

GB = 10**9


def render(source: str, model: str, plan: SplitPlan) -> str:
    """The plan as a table plus the model it is for, the -ts argument and the reason."""
    label = f"{source} (simulated rig; rates from its profile)" if is_sim_label(source) else source
    lines = [f"gpudash plan [{label}] balance={plan.balance}, need {plan.need_bytes / GB:.1f} GB",
             f"model: {model}", "",
             f"{'GPU':<5}{'name':<28}{'usable GB':>10}{'share':>8}{'holds GB':>10}{'fill':>7}{'ms/token':>10}"]
    for s in plan.shares:
        ms = f"{s.token_time_s * 1e3:.2f}" if s.token_time_s is not None else "n/a"
        lines.append(f"{s.index:<5}{s.name.replace('NVIDIA ', '')[:27]:<28}{s.usable_bytes / GB:>10.1f}"
                     f"{s.ratio:>8.1%}{s.assigned_bytes / GB:>10.1f}{s.fill:>7.0%}{ms:>10}")
    lines += ["", f"-ts {plan.ts}", f"why: {plan.reason}"]
    return "\n".join(lines)


def _model(cfg: Config, model_gb: float | None) -> tuple[int, str]:
    """The weights' size in bytes and what they are: --model-gb, else the model file of the first
    llama.cpp server, else (no servers configured) the embedded demo model that `gpudash launch` serves;
    of a model file, what llama.cpp puts on the GPUs (the input embeddings stay on the CPU)."""
    if model_gb is not None:
        return int(model_gb * GB), f"--model-gb {model_gb:g}"
    if not cfg.servers:
        from gpudash.runtime.demo import demo_model_path

        path = demo_model_path()
        return _gpu_weights(path), f"the demo model {path}"
    from gpudash.launcher.kinds import kind_of

    found = next(((s, p) for s in cfg.servers if not s.attached and (p := kind_of(s).model_file(s)) is not None),
                 None)
    if found is None:
        usage_error("no model size: no llama.cpp server is configured (vLLM models are not one GGUF file); "
                    "pass --model-gb G")
    spec, path = found
    if not path.is_file():
        usage_error(f"no model size: server {spec.name}'s model {path} is not a file; fix its `model` or "
                    "pass --model-gb G")
    return _gpu_weights(path), f"server {spec.name}'s model {path}"


def _gpu_weights(path: Path) -> int:
    """The weights llama.cpp puts on the GPUs with every layer offloaded: the file's tensors less the input
    embeddings, which it keeps on the CPU (a file that is not GGUF counts whole)."""
    from gpudash.commands.common import usage_error
    from gpudash.launcher.shares import DamagedModel, gpu_bytes, model_shape

    try:
        shape = model_shape(path)
    except DamagedModel as err:  # GGUF, but not a model its fields can size: say so rather than guess
        usage_error(str(err))
    except ValueError:
        return path.stat().st_size
    return gpu_bytes(shape, shape.layers + 1, 0)


@click.command()
@click.option("--model-gb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Model weights in GB (10^9 bytes); default: the first llama.cpp server's model file, or the "
                   "demo model when no servers are configured.")
@click.option("--kv-gb", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="KV cache in GB, split like the layers.")
@sim_options
@click.option("--balance", type=click.Choice(["memory", "time"]), default="memory", show_default=True,
              help="memory: equal fill of free memory; time: shares by measured throughput, capped by memory.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the plan as JSON.")
@pass_config
def plan(cfg: Config, model_gb: float | None, kv_gb: float, sim: str | None, no_sim: bool, balance: str,
         as_json: bool) -> None:
    """Propose llama.cpp's -ts split from free memory and measured throughput."""
    from gpudash.advisor.planner import PlanError, plan_split
    from gpudash.advisor.rates import RatesUnavailable, budgets, rates_for

    rig = resolve_rig(cfg, sim, no_sim, quiet=as_json)
    source = rig.label
    model, what = _model(cfg, model_gb)
    topo = rig.topology()
    try:
        rates = rates_for(topo)
    except RatesUnavailable as err:
        if balance == "time":
            usage_error(f"{err}, or use --balance memory")
        rates = None
    try:
        result = plan_split(budgets(topo, rates), model, int(kv_gb * GB), balance)
    except (PlanError, RatesUnavailable) as err:
        usage_error(str(err))
    if as_json:
        data = dataclasses.asdict(result)
        data.update(source=source, sim=topo.is_sim, ratios=list(result.ratios), model=what)
        emit("plan", data)
    else:
        echo_fitted(render(source, what, result).splitlines(), "  ")  # the lines around the table wrap
