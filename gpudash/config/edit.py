"""Changes gpudash writes into the user's config file: engine knobs saved from the TUI, a found server
added as an attached [[servers]] entry. Each result is validated as a whole before the file changes."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from gpudash.config.settings import ConfigError, validate


def save_engine_knobs(path: Path, knobs: dict[str, int]) -> None:
    """Merge `knobs` into the [engine] table of the TOML file at `path` (created if missing), validated as
    a whole first so a bad result never reaches the file (the TUI's `w`). Comments in the file are not kept."""
    data: dict[str, Any] = {}
    if path.exists():
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    data.setdefault("engine", {}).update(knobs)
    validate(data, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(data), encoding="utf-8")


def save_server(path: Path, entry: dict[str, Any]) -> None:
    """Append a [[servers]] entry (a found server, attached: name, kind, url) to the TOML file at `path`
    (created if missing), validated as a whole first so a bad result never reaches the file (the Servers
    view's `W`). A name already there is refused. The file is the user's: its text, comments included,
    stays as it was, and the entry is added after it."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    data = tomllib.loads(text)
    if any(s.get("name") == entry.get("name") for s in data.get("servers", [])):
        raise ConfigError([f"{path}: a server named {entry.get('name')!r} is there already; rename one of them"])
    # an entry's values are scalars (name, kind, url, ...): they dump as the table's own lines
    block = ("\n" if text and not text.endswith("\n") else "") + "\n[[servers]]\n" + tomli_w.dumps(entry)
    try:
        merged = tomllib.loads(text + block)
    except tomllib.TOMLDecodeError:  # `servers = [...]` written inline: a [[servers]] table cannot follow it
        merged = {}
    if merged.get("servers", [])[-1:] != [entry]:
        raise ConfigError([f"{path}: its servers are an inline array, so an entry cannot be added after them; "
                           "write them as [[servers]] tables"])
    validate(merged, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(block)
