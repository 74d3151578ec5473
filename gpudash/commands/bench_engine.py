"""`gpudash bench engine`: the transfer engine against the native copy, in a table that fits the terminal
(ratio column, core-seconds per GB), plus, on a sim rig whose GPUs reach each other, what the relay paths
add; `--tune` sweeps chunk sizes, fallback thresholds and (on cuda) the pageable staging thresholds and
stores them for this machine (gpudash/runtime/tuned.py). Results go into the store."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import click
from rich.table import Table

from gpudash.engine import EngineError
from gpudash.engine.bench import CUDA_SIZES, MEMORY, SIM_SIZES, BenchRow, RelayFigure, bench_title, render_tune
from gpudash import fmt
from gpudash.engine.profiles import PROFILES, get_profile
from gpudash.commands.common import db_option, db_path, pass_config, resolve_rig, usage_error
from gpudash.commands.json_out import emit
from gpudash.commands.output import console, echo_fitted, fitted_tables, plain_table, print_tables
from gpudash.config import Config, ConfigError, parse_size
from gpudash.records import Event
from gpudash.telemetry.rig import NvmlRig, SimulatedRig
from gpudash.runtime.tuned import save_tuned


def knobs_lines(knobs: dict[str, Any]) -> list[str]:
    """The engine's knobs as a two-column table, sizes in binary units like every size gpudash shows
    (2.68 MiB beside 16 MiB, never 2.81MB beside 16MiB)."""
    width = max((len(k) for k in knobs), default=0)
    return ["knobs:"] + [f"  {k:<{width}}  {fmt.knob_text(v)}" for k, v in knobs.items()]


# The result columns in groups, each table led by direction, memory and size: one table where the terminal
# is wide enough, else one a group (80 columns).
GROUPS: dict[str, tuple[str, ...]] = {
    "speed": ("engine GB/s", "native GB/s", "ratio", "x pinned native"),
    "CPU and path": ("eng core-s/GB", "nat core-s/GB", "engine path", "reps"),
}
BASELINE = "engine: copy(sync=True); medians; ratio = engine / native on the same buffers"


def _cells(r: BenchRow) -> dict[str, str]:
    return {"engine GB/s": f"{r.engine_gbps:.2f}", "native GB/s": f"{r.native_gbps:.2f}", "ratio": f"{r.ratio:.2f}x",
            "x pinned native": f"{r.vs_pinned_native:.2f}x", "eng core-s/GB": f"{r.engine_core_s_per_gb:.4f}",
            "nat core-s/GB": f"{r.native_core_s_per_gb:.4f}", "engine path": r.engine_path, "reps": str(r.reps)}


def _table(rows: list[BenchRow], groups: Sequence[str]) -> Table:
    table = plain_table(title=" and ".join(groups) if len(groups) < len(GROUPS) else None)
    for name in ("dir", "memory", "size"):
        table.add_column(name, justify="right" if name == "size" else "left", no_wrap=True)
    names = [n for g in groups for n in GROUPS[g]]
    for name in names:
        table.add_column(name, justify="left" if name == "engine path" else "right", no_wrap=True)
    for r in rows:
        cells = _cells(r)
        table.add_row(r.direction, r.memory, fmt.knob_text(r.size), *(cells[n] for n in names))
    return table


def relay_paths(backend: str, profile: str) -> tuple[RelayFigure | None, str]:
    """What the relay paths add on this bench's rig, measured where it has any: a sim rig whose GPUs
    reach each other peer to peer (8xh20's NVLink); otherwise None and a line that says why there is
    no figure (a copy there only ever takes its GPU's own link)."""
    if backend != "sim":
        return None, ("relays: not measured here (the relay figure is a sim measurement; "
                      "`--backend sim --profile 8xh20` shows it)")
    rig = get_profile(profile)
    if len(rig.gpus) == 1:
        return None, f"relays: none on SIM {profile}: one GPU, so every copy takes its own link"
    if not any(rig.peer_gbps(v, 0) for v in range(1, len(rig.gpus))):
        return None, (f"relays: none on SIM {profile}: its GPUs cannot copy peer to peer, so every copy "
                      "takes its GPU's own link")
    from gpudash.engine.bench import relay_figure

    fig = relay_figure(profile)
    return fig, (f"relays (SIM {profile}): a 1 GiB copy into GPU {fig.target} over its own link and through "
                 f"{fig.relays} peer GPUs (host -> peer -> GPU {fig.target}): {fig.measured_gbps:.1f} GB/s of "
                 f"the {fig.model_gbps:.1f} GB/s the link model allows ({fig.percent:.1f}%)")


def print_results(title: str, knobs: dict[str, Any], baseline: str, rows: list[BenchRow], relays: str) -> None:
    """The bench as text that fits the terminal (piped: a row a line)."""
    echo_fitted([f"gpudash bench engine: {title}"], "  ")
    for line in knobs_lines(knobs):
        click.echo(line)
    echo_fitted([f"baseline: {baseline}; {BASELINE}", ""], "  ")
    out = console()
    print_tables(out, fitted_tables(out, tuple(GROUPS), lambda groups: _table(rows, groups)))
    echo_fitted(["", relays], "  ")


class _Bar:
    """The bench's progress on stderr: a bar with ETA when the number of steps is known (the bench),
    elapsed time alone when it is not (the autotune sweep)."""

    def __init__(self, progress: Any) -> None:
        self.progress, self.task, self.steps = progress, None, 0

    def phase(self, name: str, total: int | None) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[self.task].total or self.steps)
        self.task, self.steps = self.progress.add_task(name, total=total), 0

    def __call__(self, what: str) -> None:
        self.steps += 1
        self.progress.update(self.task, completed=self.steps - 1, description=what)


def _record(cfg: Config, db: str | None, source: str, rows: list[Any], tuned: dict[str, int] | None) -> str:
    from gpudash.store import Store

    path = db_path(cfg, db)
    with Store.open(path) as store:
        sid = store.begin_session(source, cfg, note="gpudash bench engine")  # `history` shows it as a bench
        now = time.time()
        if tuned:
            store.record_event(sid, Event(now, "autotune", "engine.autotune", "engine", None, tuned))
        for r in rows:
            store.record_event(sid, Event(now, "bench", "bench.engine", f"{r.direction} {r.memory} {r.size}",
                                          {"native_gbps": r.native_gbps}, r.as_dict()))
        store.end_session(sid)
    return f"recorded as session {sid} in {path}"


def _store_tuned(backend: str, knobs: dict[str, int]) -> str:
    """Store a cuda tuning for this machine (used wherever [engine] leaves a knob unset); a sim rig's
    figures say nothing about this machine, so they are only shown."""
    if backend != "cuda":
        return "not stored: a sim rig's tuning says nothing about this machine"
    try:
        path = save_tuned(knobs)
    except (ConfigError, OSError) as err:
        usage_error(f"cannot store the tuned knobs: {err}")
    return f"stored for this machine in {path} (used for every [engine] knob the config leaves unset)"


@click.command("engine")
@click.option("--backend", type=click.Choice(["cuda", "sim"]), default=None,
              help="Default: cuda when an NVIDIA driver is present, else the sim rig.")
@click.option("--profile", type=click.Choice(sorted(PROFILES)), default=None,
              help="Sim rig for --backend sim (default: the config's [sim] profile).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the results as JSON.")
@click.option("--tune", is_flag=True, default=False,
              help="Sweep chunk sizes, fallback and staging thresholds, store them for this machine (cuda), "
                   "then bench.")
@click.option("--sizes", default=None, help="Comma-separated copy sizes, e.g. 64KiB,16MiB,1GiB.")
@click.option("--no-store", is_flag=True, default=False, help="Do not record the results in the store.")
@db_option
@pass_config
def bench_engine(cfg: Config, backend: str | None, profile: str | None, as_json: bool,
                 tune: bool, sizes: str | None, no_store: bool, db: str | None) -> None:
    """Engine vs native copies (H2D/D2H; pinned, pageable one-shot and reused)."""
    from gpudash.engine.autotune import tune as run_tune
    from gpudash.engine.bench import check_engine, run_bench, side_for

    try:
        size_list = tuple(parse_size(s) for s in sizes.split(",")) if sizes else None
    except ValueError as err:
        usage_error(f"--sizes: {err}")
    if size_list and any(n <= 0 for n in size_list):
        usage_error("--sizes: every size must be at least 1 byte")
    if backend is None:
        backend = "sim" if resolve_rig(cfg, None, False, quiet=True).is_sim else "cuda"
    rig = SimulatedRig(profile or cfg.sim.profile) if backend == "sim" else NvmlRig()
    source = rig.label if rig.is_sim else "cuda"  # the session label says which backend ran the bench
    try:
        eng = rig.make_engine(cfg)
        check_engine(eng)
    except EngineError as err:
        usage_error(f"cannot run the {backend} engine bench: {err}")
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    steps = len(size_list or (CUDA_SIZES if backend == "cuda" else SIM_SIZES)) * 2 * len(MEMORY)
    progress = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                        console=Console(stderr=True), transient=True, disable=as_json)
    say = _Bar(progress)
    out: dict[str, Any] = {"source": source, "sim": backend == "sim"}
    tuned = None
    with eng, progress:
        if tune:
            say.phase("autotune", None)
            res = run_tune(eng, progress=say)
            stored = _store_tuned(backend, res.knobs)
            eng.set(**res.knobs)
            tuned = res.knobs
            out["tune"] = {"knobs": res.knobs, "table": res.table, "notes": res.notes, "stored": stored}
        say.phase("bench", steps)
        rows = list(run_bench(eng, size_list, progress=say))
        out["knobs"] = eng.knobs()
        out["device"] = eng.topology().gpus[0].name
        out["baseline"] = side_for(eng).label
        title = bench_title(eng)
    out["rows"] = [r.as_dict() for r in rows]
    fig, relays = relay_paths(backend, rig.profile or "")
    out["relays"] = None if fig is None else {"profile": fig.profile, "target": fig.target, "relays": fig.relays,
                                              "measured_gbps": fig.measured_gbps, "model_gbps": fig.model_gbps,
                                              "percent": fig.percent}
    out["relays_note"] = relays
    if not no_store:
        try:
            out["store"] = _record(cfg, db, source, rows, tuned)
        except Exception as err:  # the bench result stands even if the store is unavailable
            out["store"] = f"not recorded: {err}"
    if as_json:
        emit("bench-engine", out, indent=1)
        return
    if tune:
        click.echo(f"autotune ({source}): {tuned}; {out['tune']['stored']}")
        click.echo(render_tune(res))
    print_results(title, out["knobs"], out["baseline"], rows, relays)
    if "store" in out:
        echo_fitted([out["store"]], "  ")
