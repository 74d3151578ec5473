"""The one way a command prints `--json`: a JSON object whose first key is `schema_version`, the version of the
JSON Schema that documents that output (gpudash/commands/schemas/<output>.json, shipped in the package), so a
script can check what it reads and tell a change of shape from a bug. The number lives in the schema file
alone (`properties.schema_version.const`); a change that breaks a script bumps it there."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import click

from gpudash.fmt import json_text

SCHEMAS = Path(__file__).resolve().parent / "schemas"
OUTPUTS = ("status", "fleet", "history", "doctor", "plan", "probe", "bench-engine", "bench-overlap", "bench-share")


def schema_path(output: str) -> Path:
    return SCHEMAS / f"{output}.json"


@cache
def schema_version(output: str) -> int:
    return int(json.loads(schema_path(output).read_text(encoding="utf-8"))["properties"]["schema_version"]["const"])


def emit(output: str, body: Mapping[str, object], indent: int = 2) -> None:
    """Print `body` as the `output` document, `schema_version` first (json_text: no NaN, bytes as hex)."""
    click.echo(json_text({"schema_version": schema_version(output), **body}, indent=indent))
