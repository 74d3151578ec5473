"""`gpudash config show`: the effective settings (embedded defaults, this machine's tuned engine knobs and
the config file) as TOML; every field carries its documentation as a comment, and each [engine] knob
also says where its value came from. Secrets show masked."""

from __future__ import annotations

import textwrap
from typing import Callable

import click
import tomli_w
from pydantic import BaseModel

from gpudash import fmt
from gpudash.commands.groups import Group
from gpudash.commands.common import pass_config
from gpudash.config import Config, EngineSettings, default_config_path
from gpudash.redact import mask_text, redact_spec

Note = Callable[[BaseModel, str], str | None]


def _doc(text: str | None) -> list[str]:
    return textwrap.wrap(" ".join((text or "").split()), 100, initial_indent="# ", subsequent_indent="# ",
                         break_on_hyphens=False)


def documented_toml(model: BaseModel, path: tuple[str, ...] = (), note: Note = lambda m, n: None) -> list[str]:
    """`model` as TOML lines, each field under its documentation (pydantic's description) as comments and
    `note(model, field)`, when it says something, after the value. Plain values come before tables, as
    TOML needs; an unset optional field shows as a comment, since TOML has no null. A server's secret env
    values and flags show masked (redact.redact_spec), as in every copy gpudash writes."""
    data = redact_spec(model.model_dump(mode="json"))
    values: list[str] = []
    tables: list[str] = []
    for name, field in type(model).model_fields.items():
        value, doc, dotted = getattr(model, name), _doc(field.description), ".".join((*path, name))
        if isinstance(value, BaseModel):
            tables += ["", *doc, f"[{dotted}]", *documented_toml(value, (*path, name), note)]
        elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            tables += ["", *doc]
            for item in value:
                tables += [f"[[{dotted}]]", *documented_toml(item, (*path, name), note), ""]
            tables.pop()
        elif isinstance(value, dict):
            tables += ["", *doc, f"[{dotted}]", *tomli_w.dumps(data[name]).splitlines()]
        elif value is None:
            values += [*doc, f"# {name}: unset"]
        else:
            said = note(model, name)
            line = tomli_w.dumps({name: data[name]}).rstrip("\n")
            values += [*doc, f"{line}  # {said}" if said else line]
    return values + tables


def _note(model: BaseModel, name: str) -> str | None:
    """After a value: where an [engine] knob came from, and a size in bytes as it reads (64 MiB)."""
    value = getattr(model, name)
    size = fmt.knob_text(value) if name.endswith("_bytes") and isinstance(value, int) else None
    origin = model.origin(name) if isinstance(model, EngineSettings) else None
    return "; ".join(part for part in (origin, size) if part and part != str(value)) or None


@click.group(cls=Group)
def config() -> None:
    """Inspect gpudash's settings."""


@config.command()
@pass_config
def show(cfg: Config) -> None:
    """Print the effective config as commented TOML (a bad file prints one line per problem and exits 2)."""
    click.echo(mask_text("\n".join(documented_toml(cfg, note=_note)).strip("\n")))


@config.command()
def path() -> None:
    """Print the config file gpudash reads when --config is not given."""
    click.echo(str(default_config_path()))
