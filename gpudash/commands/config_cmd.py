"""`gpudash config show`: the effective settings (embedded defaults, this machine's tuned engine knobs and
the config file) as TOML; every field carries its documentation as a comment, and each [engine] knob
also says where its value came from. Secrets show masked."""

from __future__ import annotations

import textwrap
from collections.abc import Collection
from typing import Callable

import click
import tomli_w
from pydantic import BaseModel

from gpudash import fmt
from gpudash.commands.groups import Group
from gpudash.commands.common import pass_config
from gpudash.commands.output import terminal_width
from gpudash.config import Config, EngineSettings, LlamaCppSpec, ServerSpec, default_config_path
from gpudash.config.servers import SPEC_CLASSES
from gpudash.redact import mask_text, redact_spec

Note = Callable[[BaseModel, str], str | None]


COMMENT_WIDTH = 100  # comments wrap here, or at the terminal's edge where it is narrower


def _doc(text: str | None) -> list[str]:
    return textwrap.wrap(" ".join((text or "").split()), min(COMMENT_WIDTH, terminal_width() or COMMENT_WIDTH),
                         initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)


def documented_toml(model: BaseModel, path: tuple[str, ...] = (), note: Note = lambda m, n: None,
                    only: Collection[str] | None = None) -> list[str]:
    """`model` as TOML lines, each field under its documentation (pydantic's description) as comments and
    `note(model, field)`, when it says something, after the value. Plain values come before tables, as
    TOML needs; an unset optional field shows as a comment, since TOML has no null. `only`: these fields. A
    server's secret env values and flags show masked (redact.redact_spec), as in every copy gpudash writes."""
    data = redact_spec(model.model_dump(mode="json"))
    values: list[str] = []
    tables: list[str] = []
    for name, field in type(model).model_fields.items():
        if only is not None and name not in only:
            continue
        value, doc, dotted = getattr(model, name), _doc(field.description), ".".join((*path, name))
        if name == "servers" and value == []:
            tables += ["", *doc, *servers_template()]
            continue
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


def servers_template() -> list[str]:
    """With no [[servers]] configured, every field an entry takes, commented out under its documentation:
    those of every kind, then each kind's own (README: "Watch a server gpudash did not start")."""
    out = [*_doc("None configured: `launch` and `serve` run the embedded demo. An entry takes the fields below "
                 "(commented out: copy those you need). With `url` gpudash only reads a server that runs already "
                 "(the README's \"Watch a server gpudash did not start\"); without it, gpudash launches `model`."),
           "#", "#[[servers]]"]
    common = ServerSpec.model_fields
    out += _commented(documented_toml(LlamaCppSpec.model_construct(name="qwen", url="http://127.0.0.1:8080"),
                                      ("servers",), only=common))
    for kind, cls in SPEC_CLASSES.items():
        own = [f for f in cls.model_fields if f not in common]
        if own:
            out += ["#", f"# kind = \"{kind}\" also takes:",
                    *_commented(documented_toml(cls.model_construct(name="qwen"), ("servers",), only=own))]
    return out


def _commented(lines: list[str]) -> list[str]:
    """TOML lines commented out (documentation and unset fields are comments already)."""
    return [ln if ln.startswith("#") else f"#{ln}" if ln else "#" for ln in lines]


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
