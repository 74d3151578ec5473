"""`gpudash doctor`: pass / warn / fail for what operators otherwise check by hand (PCIe link under
load, resizable BAR, P2P, NUMA, shares, enforce-eager, llama.cpp archs, NCCL on mixed cards).
Exit code 0 when no check fails, 1 when any does, 2 for a usage error."""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING

import click

from gpudash.commands.common import pass_config, resolve_rig, sim_options
from gpudash.commands.json_out import emit
from gpudash.commands.output import terminal_width, wrapped
from gpudash.config import Config
from gpudash.labels import is_sim_label

if TYPE_CHECKING:
    from gpudash.advisor.checks import CheckResult

_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}


def render(source: str, results: list[CheckResult], width: int | None = None) -> str:
    """The human report: one block per check, evidence lines indented, the fix last; each line wrapped
    to `width` under its indent (a fix's rows under its words), or one line each where `width` is None."""
    label = f"{source} (simulated rig, not real hardware)" if is_sim_label(source) else source
    out = [*wrapped(f"gpudash doctor [{label}]", width), ""]
    for r in results:
        out += wrapped(f"{_MARK[r.status]}  {r.title}", width, "      ")
        for line in r.evidence:
            out += wrapped(f"      {line}", width, "  ")
        if r.fix and r.status != "pass":
            out += wrapped(f"      fix: {r.fix}", width, "     ")
    counts = {s: sum(r.status == s for r in results) for s in _MARK}
    out += ["", ", ".join(f"{n} {s}" for s, n in counts.items())]
    return "\n".join(out)


@click.command()
@sim_options
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the results as JSON.")
@click.option("--load-seconds", type=click.FloatRange(min=0.05, max=30), default=0.4, show_default=True,
              help="How long the engine copies to every GPU while the link state is read.")
@pass_config
def doctor(cfg: Config, sim: str | None, no_sim: bool, as_json: bool, load_seconds: float) -> None:
    """Check links, BAR, P2P, NUMA, shares and builds; each check gives its evidence and its fix."""
    from gpudash.advisor.checks import exit_code, run_checks
    from gpudash.advisor.gather import gather

    rig = resolve_rig(cfg, sim, no_sim, quiet=as_json)
    source = rig.label
    facts = gather(rig, cfg, load_s=load_seconds)
    results = run_checks(facts)
    code = exit_code(results)
    if as_json:
        emit("doctor", {"source": source, "sim": rig.is_sim, "exit_code": code,
                        "checks": [dataclasses.asdict(r) for r in results]})
    else:
        click.echo(render(source, results, terminal_width()))
    sys.exit(code)
