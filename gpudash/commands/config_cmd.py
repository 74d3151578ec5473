"""`gpudash config show`: the effective settings (embedded defaults + the config file) as TOML."""

from __future__ import annotations

import click

from gpudash.commands.common import pass_config
from gpudash.config import Config, default_config_path, to_toml


@click.group()
def config() -> None:
    """Inspect gpudash's settings."""


@config.command()
@pass_config
def show(cfg: Config) -> None:
    """Print the effective config as TOML (a bad file prints one line per problem and exits 2)."""
    click.echo(to_toml(cfg).rstrip("\n"))


@config.command()
def path() -> None:
    """Print the config file gpudash reads when --config is not given."""
    click.echo(str(default_config_path()))
