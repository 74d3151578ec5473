"""`gpudash bench share SERVER --shares 1.0,0.6,0.3`: re-launch one configured server at each memory
share through the Supervisor, run the probe workload, and print tokens/s and TTFT per share, so the
operator can check on their own box whether a smaller share costs throughput (the RTX 5080 report:
a 0.5B model at 30% kept 12,766 of 12,838 tok/s).

vLLM gets the share as --gpu-memory-utilization; llama.cpp gets -ngl / -c chosen by
the llama.cpp kind's `budget_spec` so weights + KV cache fit share * VRAM. Without a GPU the command says
so and exits 2, unless --cpu: then the same loop runs on the CPU (labelled CPU; shares change nothing
there, it only proves the re-launch and probe path).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click

from gpudash.commands.common import pass_config, usage_error
from gpudash.commands.json_out import emit
from gpudash.config import Config, ServerSpec


@dataclass(frozen=True)
class ShareRow:
    share: float
    flags: str            # what the share became on the command line
    budget_mib: float | None
    used_mib: float | None  # NVML: memory the server's processes hold after the probe (GPU runs)
    tokens_per_s: float | None
    ttft_median_ms: float | None
    ttft_p90_ms: float | None
    requests: int
    failed: int
    error: str | None = None


def parse_shares(text: str) -> list[float]:
    """'1.0,0.6,0.3' -> [1.0, 0.6, 0.3]; ValueError naming the bad item."""
    from gpudash.launcher.shares import parse_share

    return [parse_share(item, "--shares item") for item in text.split(",")]


def spec_at(spec: ServerSpec, share: float, gpu_totals: dict[int, int]) -> tuple[ServerSpec, str, int | None]:
    """The spec re-launched at `share`, the flags that carry it, and the budget in bytes (None on CPU)."""
    from gpudash.launcher.kinds import kind_of
    from gpudash.launcher.shares import server_gpus

    budget = int(sum(share * gpu_totals[g] for g in server_gpus(spec, gpu_totals))) if gpu_totals else None
    new, flags = kind_of(spec).at_share(spec, share, gpu_totals)
    return new, flags, budget


def measure(sup: Any, name: str, requests: int, concurrency: int, prompt_words: int,
            max_tokens: int) -> tuple[float | None, Any]:
    """Probe a ready server: two warm-up requests, then `requests` new prompts (no shared prefix)."""
    from gpudash.launcher.probe.correlation import summarize
    from gpudash.launcher.probe.runner import run_probe

    url = sup.base_url(name)
    run_probe(url, 2, 1, 0.0, prompt_words, max_tokens, server=name, seed=1)
    t0 = time.perf_counter()
    samples = run_probe(url, requests, concurrency, 0.0, prompt_words, max_tokens, server=name, seed=2)
    wall = time.perf_counter() - t0
    tokens = sum(s.completion_tokens or 0 for s in samples if s.ok)
    return (tokens / wall if tokens else None), summarize(samples)


def warn_low_free(nvml: Any, sup: Any, spec: ServerSpec) -> None:
    """Say on stderr when the GPUs lack the free memory the share asks for (the run goes on)."""
    from gpudash.records import Snapshot
    from gpudash.launcher.shares import start_warnings

    tick = nvml.poll()
    pids = sup.pids()
    procs = tuple(p if p.pid not in pids else replace(p, server=pids[p.pid]) for p in tick.get("gpu_processes", ()))
    snap = Snapshot(ts=time.time(), tick=0, source="nvml", gpus=tuple(tick.get("gpus", ())), gpu_processes=procs)
    for w in start_warnings(snap, spec):
        click.echo(f"gpudash: warning: {w.message}", err=True)


def render(server: str, where: str, rows: list[ShareRow]) -> str:
    def num(x: float | None, width: int, prec: int = 1) -> str:
        return ("n/a" if x is None else f"{x:.{prec}f}").rjust(width)

    ref = next((r.tokens_per_s for r in rows if r.tokens_per_s), None)
    out = [f"gpudash bench share {server} [{where}]", "",
           f"{'share':>6} {'budget MiB':>11} {'used MiB':>9} {'tok/s':>9} {'vs first':>9} {'TTFT med ms':>12} "
           f"{'TTFT p90 ms':>12} {'failed':>7}  flags"]
    for r in rows:
        if r.error:
            out.append(f"{r.share:6g}  did not start: {r.error}")
            continue
        ratio = f"{r.tokens_per_s / ref:.2f}x" if r.tokens_per_s and ref else "n/a"
        out.append(f"{r.share:6g} {num(r.budget_mib, 11, 0)} {num(r.used_mib, 9, 0)} {num(r.tokens_per_s, 9)} "
                   f"{ratio:>9} {num(r.ttft_median_ms, 12)} {num(r.ttft_p90_ms, 12)} "
                   f"{f'{r.failed}/{r.requests}':>7}  {r.flags}")
    out += ["", "tok/s: completion tokens of all requests / wall time of the batch; vs first: against the first "
                "share that produced tokens; used: NVML per-process memory of the server after the batch."]
    if where == "CPU":
        out.append("CPU run: no GPU here, so every share measures the same CPU; run on the GPU box for real numbers.")
    return "\n".join(out)


@click.command("share")
@click.argument("server")
@click.option("--shares", "shares_text", default="1.0,0.6,0.3", show_default=True,
              help="Comma-separated memory shares to measure, each in (0, 1].")
@click.option("--requests", type=click.IntRange(min=1), default=20, show_default=True, help="Probe requests per share.")
@click.option("--concurrency", type=click.IntRange(min=1, max=256), default=4, show_default=True,
              help="Requests in flight at once.")
@click.option("--prompt-words", type=click.IntRange(min=1), default=None,
              help="Prompt length in words (default: [probe] prompt_tokens).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="Tokens generated per request.")
@click.option("--cpu", is_flag=True, default=False,
              help="Run without a GPU (exercises the re-launch loop; every share measures the same CPU).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the rows as JSON.")
@pass_config
def bench_share(cfg: Config, server: str, shares_text: str, requests: int, concurrency: int,
                prompt_words: int | None, max_tokens: int, cpu: bool, as_json: bool) -> None:
    """Re-launch SERVER at each memory share and print tokens/s and TTFT per share."""
    from gpudash.launcher.errors import LaunchError
    from gpudash.launcher.supervisor import Supervisor
    from gpudash.telemetry.inbox import Inbox
    from gpudash.gpu.nvml import driver_available

    try:
        shares = parse_shares(shares_text)
    except ValueError as err:
        usage_error(str(err))
    specs = {s.name: s for s in cfg.servers}
    if server not in specs:
        usage_error(f"no server named '{server}' in the config (configured: {', '.join(specs) or 'none'}); "
                    f"add a [[servers]] entry or pick one of those")
    reason = driver_available()
    if reason is not None and not cpu:
        usage_error(f"bench share measures GPU memory shares but this machine has no NVIDIA GPU ({reason}); "
                    f"run it on the GPU box, or pass --cpu to exercise the loop on the CPU")
    nvml = None
    totals: dict[int, int] = {}
    if reason is None and not cpu:
        from gpudash.telemetry.nvml import NvmlSource

        nvml = NvmlSource()
        totals = {g.index: g.mem_total for g in nvml.poll().get("gpus", ()) if g.mem_total}
    spec = specs[server]
    try:
        plans = [spec_at(spec, s, totals) for s in shares]
    except ValueError as err:
        usage_error(str(err))
    rows: list[ShareRow] = []
    with tempfile.TemporaryDirectory(prefix="gpudash-bench-share-") as logs:
        sup = Supervisor([plans[0][0]], Inbox(), Path(logs))
        try:
            for i, (share, (new, flags, budget)) in enumerate(zip(shares, plans)):
                mib = None if budget is None else budget / 2**20
                if nvml is not None:
                    warn_low_free(nvml, sup, new)
                try:
                    sup.start(server) if i == 0 else sup.restart(server, new)
                except LaunchError as err:
                    rows.append(ShareRow(share, flags, mib, None, None, None, None, 0, 0, error=err.cause))
                    continue
                words = prompt_words or cfg.probe.prompt_tokens
                try:
                    tps, summary = measure(sup, server, requests, concurrency, words, max_tokens)
                except Exception as err:  # the server died or stopped answering mid-batch
                    rows.append(ShareRow(share, flags, mib, None, None, None, None, requests, requests,
                                         error=f"probe failed: {type(err).__name__}: {err}"))
                    continue
                used = None
                if nvml is not None:
                    pids = sup.pids()
                    held = [p.used_bytes for p in nvml.poll().get("gpu_processes", ()) if p.pid in pids]
                    used = sum(b for b in held if b) / 2**20 if held and all(b is not None for b in held) else None
                rows.append(ShareRow(share, flags, mib, used, tps, summary.ttft_median_ms, summary.ttft_p90_ms,
                                     summary.requests, summary.failed))
        finally:
            sup.stop_all()
            if nvml is not None:
                nvml.close()
    where = "CPU" if not totals else f"{len(totals)} GPU(s)"
    if as_json:
        emit("bench-share", {"server": server, "where": where, "rows": [asdict(r) for r in rows]})
    else:
        click.echo(render(server, where, rows))
