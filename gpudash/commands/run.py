"""`gpudash run -- CMD ARGS...`: run an unmodified program with the transfer engine inside it.

The program starts with libgpudash_preload.so first in LD_PRELOAD, its name in GPUDASH_PRELOAD_NAME and
its start-up knobs in GPUDASH_PRELOAD_KNOBS: the [engine] settings the config file sets (and this machine's
tuned ones it leaves unset; the library's own defaults hold for the others), then --knob. gpudash waits for it, forwards the signals sent to
gpudash (not the terminal's Ctrl-C and Ctrl-\\, which reach the program from the terminal already) and
exits with its exit code (128 + N when signal N ended it), or as a shell does when it cannot start it:
127 for a command not found, 126 for one that is not executable.

The program is started first: before it, gpudash reads only what its environment needs (the library's path,
the config file's [engine] table as TOML, the knobs checked by the knob table's rule) and imports neither the
settings model nor the engine's copy machinery; the stats blocks and the summary are read once it runs. A
program is started in about what `gpudash --version` takes (benchmarks/bench_run_startup.py).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from gpudash.commands.common import config_path, config_problems, usage_error
from gpudash.config import ConfigError, parse_knobs, read_config_file
from gpudash.config.files import any_tuned
from gpudash.engine.errors import EngineError
from gpudash.preload.env import (KEEP_FOR_ENV, KNOBS_PREFIX, PRELOAD_KNOBS, SHM_DIR, STATS_PREFIX, odd_entry,
                                 preload_env)

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
TERMINAL_KEYS = (signal.SIGINT, signal.SIGQUIT)  # the tty sends these to the whole foreground group
# Python ignores these; a program started by subprocess gets them back at their default (restore_signals)
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)
SI_KERNEL = 0x80  # si_code of a signal the kernel sent (the tty's), as opposed to kill() (SI_USER)


def startup_knobs(path: str | None, knob_args: tuple[str, ...]) -> dict[str, Any]:
    """The preload knobs the config file's [engine] table and this machine's tuned file set, overridden by
    --knob NAME=VALUE (sizes like 4MiB allowed); exits 2 naming the first bad one. Read without the settings
    model (gpudash.config.values holds the one rule): the rest of the config file is not the program's, and
    is not read before it starts."""
    given: dict[str, str] = {}
    for arg in knob_args:
        key, eq, value = arg.partition("=")
        if not eq or not key:
            usage_error(f"--knob expects NAME=VALUE, got {arg!r}; e.g. --knob staging_threads=8")
        if key not in PRELOAD_KNOBS:
            usage_error(f"--knob {key}: not a knob of a preloaded engine; use one of {', '.join(PRELOAD_KNOBS)}")
        given[key] = value
    try:
        where, data = read_config_file(path)
        from_file = (data or {}).get("engine", {})
        checked = parse_knobs(from_file)
        tuned = _tuned_knobs(from_file)
    except (ConfigError, ValueError, AttributeError) as err:
        _config_fails(path, err)
    try:
        checked |= parse_knobs(given)
    except ValueError as err:
        usage_error(f"--knob {err}")
    merged = {**tuned, **checked}
    return {k: merged[k] for k in PRELOAD_KNOBS if k in merged}


def _tuned_knobs(from_file: dict[str, Any]) -> dict[str, Any]:
    """This machine's tuned knobs that the config file leaves unset. Without a tuned file (the usual case)
    nothing is imported and NVML is not asked; with one, the machine's identity comes from NVML first."""
    if not any_tuned():
        return {}
    from gpudash.runtime.tuned import load_tuned

    found = load_tuned()
    return {} if found is None else {k: v for k, v in found[1].items() if k not in from_file}


def _config_fails(path: str | None, err: Exception) -> NoReturn:
    """Exit 2 with the config file's problems as every command words them (the settings model's lines)."""
    if not isinstance(err, ConfigError):
        from gpudash.config import load_config

        try:
            load_config(path)
        except ConfigError as found:
            err = found
        else:  # the model and the knob rule disagree: say what the rule found rather than run
            err = ConfigError([f"{path or 'the config file'}: engine: {err}"])
    config_problems(err)


class _Blocks:
    """Keeps the stats blocks of the program (and of its preloaded children) open while they run, so
    their last values stay readable after each process removes its block at exit. The program itself
    (gpudash's child) leaves its blocks at exit for this to read, so a program that ends before the
    first look is seen too."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.views: dict[int, Any] = {}

    def watch(self) -> None:
        import logging

        from gpudash.preload.shm import BlockUnavailable, OddEntry, StatsView
        from gpudash.proctree import descendants

        for pid in [self.root, *descendants(self.root)]:
            if pid not in self.views:
                try:
                    self.views[pid] = StatsView(pid)
                except OddEntry as err:  # a FIFO or another user's file by that name: never waited on
                    logging.getLogger(__name__).debug("%s", err)
                except BlockUnavailable:
                    pass

    def finish(self) -> list[Any]:
        """The last values of every block seen (one a crash left behind included); then the blocks of
        the processes that are gone are removed."""
        import psutil

        from gpudash.preload.shm import BlockUnavailable

        self.watch()
        out = []
        for pid, view in sorted(self.views.items()):
            try:
                out.append(view.read())
            except BlockUnavailable as err:
                click.echo(f"gpudash run: the engine stats of pid {pid} cannot be read: {err}", err=True)
            view.close()
            if not psutil.pid_exists(pid):
                _remove_blocks(pid)
        return out


def _remove_blocks(pid: int) -> None:
    """The blocks of a process that is gone: regular files of this user only (another name there is
    not gpudash's to remove)."""
    for prefix in (STATS_PREFIX, KNOBS_PREFIX):
        path = SHM_DIR / f"{prefix}{pid}"
        try:
            if odd_entry(path.lstat()) is None:
                path.unlink()
        except FileNotFoundError:
            pass


def _wait(pid: int, blocks: _Blocks | None) -> int:
    """Forward signals until the child exits; its exit code (negative: the signal that ended it)."""
    while True:
        info = signal.sigtimedwait(FORWARDED, 0.05)
        if info is not None and not (info.si_code == SI_KERNEL and info.si_signo in TERMINAL_KEYS):
            try:
                os.kill(pid, info.si_signo)
            except ProcessLookupError:
                pass
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if blocks is not None:
            blocks.watch()


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--name", default=None,
              help="Name the program's engine stats carry (default: the program's file name).")
@click.option("--knob", "knob_args", multiple=True, metavar="NAME=VALUE",
              help="A start-up engine knob, e.g. --knob staging_threads=8 --knob h2d_chunk_bytes=4MiB (repeatable).")
@click.option("--stats", is_flag=True, default=False,
              help="When the program ends, print the copies the engine took and passed through, per direction.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, name: str | None, knob_args: tuple[str, ...], stats: bool,
        command: tuple[str, ...]) -> None:
    """Run CMD with the transfer engine carrying its CUDA host<->device copies (LD_PRELOAD).

    Example: gpudash run --name loader -- python load.py
    """
    knobs = startup_knobs(config_path(ctx), knob_args)
    label = name or Path(command[0]).name
    try:
        env = preload_env(os.environ, label, knobs)
    except EngineError as err:
        usage_error(str(err))
    if stats:
        env[KEEP_FOR_ENV] = str(os.getpid())
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # queued for _wait, never lost
    try:
        try:  # posix_spawn: no fork of this process, and nothing imported that the start does not need
            pid = os.posix_spawnp(command[0], list(command), env, setsigmask=old_mask, setsigdef=RESTORED)
        except OSError as err:  # as shells exit: 127 for a command not found, 126 for one that cannot run
            from gpudash.outside import printable

            click.echo(f"gpudash: cannot run '{printable(command[0])}': {err.strerror}; check the command after --",
                       err=True)
            sys.exit(127 if isinstance(err, FileNotFoundError) else 126)
        blocks = _Blocks(pid) if stats else None
        rc = _wait(pid, blocks)
        while signal.sigtimedwait(FORWARDED, 0) is not None:  # too late to forward: the program has ended
            pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    if blocks is not None:
        _print_stats(label, blocks.finish())
    _remove_blocks(pid)  # a program killed by a signal could not remove its own
    sys.exit(rc if rc >= 0 else 128 - rc)


def _print_stats(label: str, seen: list[Any]) -> None:
    if not seen:  # a block appears at a process's first CUDA copy: a program that never copies has none
        click.echo(f"gpudash run: {label} published no engine stats: it made no CUDA host<->device copy (if it "
                   "did copy, the preload library did not load, and the program's stderr says why)", err=True)
    for s in seen:
        click.echo(f"gpudash run: engine stats of {s.name or label} (pid {s.pid}, {s.state}):", err=True)
        for line in s.summary_lines():
            click.echo(f"  {line}", err=True)
