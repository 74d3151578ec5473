"""`gpudash config show`: the effective settings (embedded defaults, this machine's tuned engine knobs and
the config file) as TOML; each [engine] knob carries its doc and where its value came from."""

from __future__ import annotations

import textwrap

import click
import tomli_w

from engine.config import KNOB_TABLE
from gpudash.commands.common import pass_config
from gpudash.config import Config, default_config_path, to_toml


def engine_table(cfg: Config) -> str:
    """The [engine] table, one knob after another: its doc as a comment, then `name = value  # origin`."""
    lines = ["[engine]"]
    for knob in KNOB_TABLE:
        lines += textwrap.wrap(knob.doc, 100, initial_indent="# ", subsequent_indent="# ")
        value = tomli_w.dumps({knob.name: getattr(cfg.engine, knob.name)}).strip()
        lines.append(f"{value}  # {cfg.engine.origin(knob.name)}")
    return "\n".join(lines)


@click.group()
def config() -> None:
    """Inspect gpudash's settings."""


@config.command()
@pass_config
def show(cfg: Config) -> None:
    """Print the effective config as TOML (a bad file prints one line per problem and exits 2)."""
    rest = to_toml(cfg.model_copy(update={"engine": None})).rstrip("\n")  # every other table, as stored
    click.echo(f"{rest}\n\n{engine_table(cfg)}")


@config.command()
def path() -> None:
    """Print the config file gpudash reads when --config is not given."""
    click.echo(str(default_config_path()))
