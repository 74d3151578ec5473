"""The `gpudash` entry point. Commands live one per module under gpudash/commands/ and are imported
only when invoked, so `gpudash --help` and the TUI start fast and the core never pulls in textual."""

from __future__ import annotations

import click

from gpudash.commands.groups import LazyGroup

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
    "deploy": "gpudash.commands.deploy:deploy",
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


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpudash")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (default: the user config dir's gpudash/config.toml).")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Watch, speed up and run LLM inference on a box of 1-8 GPUs."""
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path
