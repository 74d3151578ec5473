"""The `gpudash` entry point. Commands live one per module under gpudash/commands/ and are imported
only when invoked, so `gpudash --help` and the TUI start fast and the core never pulls in textual."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

# command name -> "module:attribute" of its click command.
COMMANDS: dict[str, str] = {
    "launch": "gpudash.commands.launch:launch",
    "record": "gpudash.commands.record:record",
    "replay": "gpudash.commands.replay:replay",
    "history": "gpudash.commands.history:history",
    "export": "gpudash.commands.export:export",
    "config": "gpudash.commands.config_cmd:config",
    "serve": "gpudash.commands.serve:serve",
    "probe": "gpudash.commands.probe:probe",
    "demo-model": "gpudash.commands.demo_model:demo_model",
    "bench": "gpudash.commands.bench:bench",
    "doctor": "gpudash.commands.doctor:doctor",
    "plan": "gpudash.commands.plan:plan",
    "llama": "gpudash.commands.llama_cmd:llama",
    "server": "gpudash.commands.server_cmd:server",
    "store": "gpudash.commands.store_cmd:store",
    "status": "gpudash.commands.status:status",
    "fleet": "gpudash.commands.fleet:fleet",
    "run": "gpudash.commands.run:run",
}


class Group(click.Group):
    """A click group whose --help lists each command with its whole first sentence, wrapped; click's
    own cuts it to fit one line and ends it with "..."."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class LazyGroup(Group):
    """A click group whose subcommands are imported on first use from a name -> "module:attr" table."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | {n for n in self.lazy if self._available(n)})

    def _available(self, name: str) -> bool:
        module = self.lazy[name].split(":")[0]
        return importlib.util.find_spec(module) is not None

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and self._available(name):
            module, attr = self.lazy[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpudash")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (default: the user config dir's gpudash/config.toml).")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Watch, speed up and run LLM inference on a box of 1-8 GPUs."""
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path
