"""The click groups gpudash's commands hang from: help that shows each command's whole first sentence, and
subcommands imported only when they run. `gpudash --help` reads each listed command's first sentence
from its module's source (its docstring, through `ast`) instead of importing it: importing every
command pulled in textual, the engine and the launcher and made `--help` 6x slower than `--version`."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys

import click


class Group(click.Group):
    """A click group whose --help lists each command with its whole first sentence, wrapped; click's
    own cuts it to fit one line and ends it with "..."."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name in self.list_commands(ctx)
                if (help_ := self.listed_help(ctx, name)) is not None]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def listed_help(self, ctx: click.Context, name: str) -> str | None:
        """A command's whole first sentence for the listing; None for a hidden or missing command."""
        cmd = self.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            return None
        return cmd.get_short_help_str(limit=sys.maxsize)


def source_command(name: str, module: str, attr: str) -> click.Command | None:
    """A stand-in for the click command `attr` of `module`, carrying only its help, read from the module's
    source without importing it: the decorator's `short_help=`/`help=` strings, else the function's
    docstring. None where the source or the function cannot be found (the caller imports it then)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_source"):
        return None
    try:
        tree = ast.parse(spec.loader.get_source(module) or "")
    except (OSError, SyntaxError, ImportError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
            given = {kw.arg: kw.value.value for deco in node.decorator_list if _makes_command(deco)
                     for kw in deco.keywords if kw.arg in ("short_help", "help", "hidden")
                     and isinstance(kw.value, ast.Constant)}
            return click.Command(name, help=given.get("help") or ast.get_docstring(node, clean=False),
                                 short_help=given.get("short_help"), hidden=bool(given.get("hidden")))
    return None


def _makes_command(deco: ast.expr) -> bool:
    """Whether a decorator is click's `command(...)`/`group(...)` (not an option's, whose help is its own)."""
    func = deco.func if isinstance(deco, ast.Call) else None
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in ("command", "group")


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

    def listed_help(self, ctx: click.Context, name: str) -> str | None:
        """A lazy command's first sentence from its source while its module is not imported yet."""
        if name in self.lazy:
            module, attr = self.lazy[name].split(":")
            if module not in sys.modules and (stand_in := source_command(name, module, attr)) is not None:
                return None if stand_in.hidden else stand_in.get_short_help_str(limit=sys.maxsize)
        return super().listed_help(ctx, name)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and self._available(name):
            module, attr = self.lazy[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)
