"""What every command shares: loading the config once, the --db/--sim/--no-sim options, and the
one-sentence usage error that exits 2. Light to import: the settings model, the rigs and the output helpers
are imported where they are used, so a command pays only for what it runs (`gpudash run` starts its program
before any of them)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import click

from gpudash.config import ConfigError
from gpudash.engine.profiles import PROFILES

if TYPE_CHECKING:
    from gpudash.config import Config
    from gpudash.telemetry.rig import Rig


def usage_error(message: str) -> NoReturn:
    """Print one clear sentence to stderr (wrapped to the terminal) and exit 2 (a usage error: nothing was
    done). The sentence often quotes something from outside (a server's answer, a path, a URL): it is shown
    as text, secrets masked."""
    from gpudash.commands.output import echo_fitted
    from gpudash.outside import printable

    echo_fitted([f"gpudash: {printable(message)}"], "    ", err=True)
    sys.exit(2)


def config_path(ctx: click.Context) -> str | None:
    """The --config file of this invocation (None: the user config file, if there is one)."""
    root = ctx.find_root()
    root.ensure_object(dict)
    return root.obj.get("config_path")


def config_problems(err: ConfigError) -> NoReturn:
    """Print a bad config file's problems, one line each, and exit 2."""
    from gpudash.outside import printable

    for line in err.problems:
        click.echo(f"gpudash: {printable(line)}", err=True)
    sys.exit(2)


def get_config(ctx: click.Context) -> Config:
    """The effective config for this invocation (loaded once); a bad file prints its problems and exits 2."""
    from gpudash.config import load_config
    from gpudash.redact import remember_config
    from gpudash.runtime.tuned import with_tuned

    root = ctx.find_root()
    root.ensure_object(dict)
    if "config" not in root.obj:
        try:
            root.obj["config"] = with_tuned(load_config(root.obj.get("config_path")))
            remember_config(root.obj["config"])  # its secrets are masked in all this run writes or prints
        except ConfigError as err:
            config_problems(err)
    return root.obj["config"]


def db_path(config: Config, db: str | None) -> Path:
    """The SQLite file to use: --db, else the config's [store] path, else the user data dir."""
    return Path(db).expanduser() if db else config.store.resolved_path()


def db_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--db", type=click.Path(dir_okay=False), default=None,
                        help="SQLite file (default: [store] path, else the user data dir).")(f)


def sim_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--sim PROFILE forces a simulated rig; --no-sim makes a missing NVIDIA driver an error."""
    f = click.option("--no-sim", is_flag=True, default=False,
                     help="Fail instead of falling back to a simulated rig when no NVIDIA driver is found.")(f)
    f = click.option("--sim", "sim", type=click.Choice(sorted(PROFILES)), default=None,
                     help="Use this simulated rig even if GPUs are present.")(f)
    return f


def resolve_rig(config: Config, sim: str | None, no_sim: bool, quiet: bool = False) -> Rig:
    """The NVML rig on a machine with an NVIDIA driver, else the config's simulated rig (said in one line
    on stderr); --sim picks a simulated rig, --no-sim makes a missing driver a usage error."""
    from gpudash.telemetry.rig import NvmlRig, SimulatedRig

    if sim and no_sim:
        usage_error("--sim and --no-sim contradict each other; pass only one")
    if sim:
        return SimulatedRig(sim)
    from gpudash.gpu.nvml import driver_available

    reason = driver_available()
    if reason is None:
        return NvmlRig()
    if no_sim:
        usage_error(f"no NVIDIA driver found ({reason}); install the driver or drop --no-sim to use a simulated rig")
    rig = SimulatedRig(config.sim.profile)
    if not quiet:
        from gpudash.commands.output import echo_fitted

        echo_fitted([f"gpudash: no NVIDIA driver found ({reason}); using the simulated rig {rig.label}"], "    ",
                    err=True)
    return rig


def pass_config(f: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: call the command with the effective Config as its first argument."""

    @functools.wraps(f)
    @click.pass_context
    def wrapper(ctx: click.Context, *args: Any, **kwargs: Any) -> Any:
        return ctx.invoke(f, get_config(ctx), *args, **kwargs)

    return wrapper
