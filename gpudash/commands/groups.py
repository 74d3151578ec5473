"""The click groups gpudash's commands hang from: help that shows each command's whole first sentence, and
subcommands imported only when they run (`gpudash --help` and the TUI start fast)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click


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
