"""Changes gpudash writes into the user's config file: engine knobs saved from the TUI (`w`), a found server
added as an attached [[servers]] entry (`W`).

The file is the user's: its text, comments and order stay as they were (a knob is changed in place with
tomlkit; a server entry is added after the text), and each result is validated as a whole before the
file changes. The change is written atomically: a new file beside it, fsynced, given the old one's mode
(and owner), then renamed over it, so a full disk or a crash leaves the old file whole, never a half-written
one that gpudash could not start with. Only a regular file is changed: a symlink (another user may plant
one in a config directory they can write), a FIFO (it would block the read for ever) or a file without a
write bit (0444, which root could otherwise write) is refused in one sentence.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
import tomlkit
from tomlkit.exceptions import TOMLKitError

from gpudash.config.settings import ConfigError, validate
from gpudash.private_fs import FILE_MODE, private_dir, write_atomic


def save_engine_knobs(path: Path, knobs: dict[str, int]) -> None:
    """Set `knobs` in the [engine] table of the TOML file at `path` (created if missing), in place: every
    other line, comment and key order stays (tomlkit)."""
    text, before = _read(path)
    try:
        doc = tomlkit.parse(text)
        engine = doc.setdefault("engine", tomlkit.table())
        if not isinstance(engine, dict):
            raise ConfigError([f"{path}: engine is {_what(engine)}, not a table, so knobs cannot be saved into "
                               "it; make it an [engine] table"])
        for name, value in knobs.items():
            engine[name] = value
        new = tomlkit.dumps(doc)
    except TOMLKitError as err:
        raise ConfigError([f"{path}: not valid TOML ({err}); fix it before saving knobs into it"]) from None
    validate(tomllib.loads(new), str(path))
    _replace(path, new, before)


def save_server(path: Path, entry: dict[str, Any]) -> None:
    """Append a [[servers]] entry (a found server, attached: name, kind, url) to the TOML file at `path`
    (created if missing). A name already there is refused, and so is a file whose `servers` is no list of
    tables (`servers = "x"`, a [servers.x] table, `servers = [1, 2]`), each in one sentence."""
    text, before = _read(path)
    data = _parsed(path, text)
    servers = data.get("servers", [])
    if not isinstance(servers, list) or not all(isinstance(s, dict) for s in servers):
        shown = repr(servers) if isinstance(servers, list) else _what(servers)
        raise ConfigError([f"{path}: servers must be a list of [[servers]] tables, but it is {shown}; write "
                           "each server as a [[servers]] table before gpudash adds one"])
    if any(s.get("name") == entry.get("name") for s in servers):
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
    _replace(path, text + block, before)


def _what(value: Any) -> str:
    return "a table" if isinstance(value, dict) else f"a {type(value).__name__} ({value!r})"


def _parsed(path: Path, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([f"{path}: not valid TOML ({err}); fix it before gpudash writes into it"]) from None


def _read(path: Path) -> tuple[str, os.stat_result | None]:
    """The file's text and its stat (("", None) when there is no file): refused (ConfigError) unless it is
    a regular file with a write bit, opened without following a link or waiting on a FIFO."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "", None
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError([f"{path}: is a symlink (to {os.readlink(path)}), and gpudash changes only a regular "
                           "file; edit the file it points to yourself, or put the file itself there"])
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError([f"{path}: is not a regular file; gpudash writes only a regular TOML file"])
    if not st.st_mode & stat.S_IWUSR:
        raise ConfigError([f"{path}: is read-only (mode {stat.S_IMODE(st.st_mode):04o}); make it writable "
                           f"(chmod u+w) for gpudash to change it"])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:  # replaced by a link since the look (ELOOP), or unreadable
        raise ConfigError([f"{path}: cannot be read ({err.strerror}); gpudash changed nothing"]) from None
    with open(fd, "rb") as f:
        opened = os.fstat(f.fileno())
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):  # swapped between the look and the open
            raise ConfigError([f"{path}: changed while gpudash read it; try again"])
        data = f.read()
    try:
        return data.decode("utf-8"), st
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: is not UTF-8 text, so not a TOML file gpudash can change"]) from None


def _replace(path: Path, text: str, before: os.stat_result | None) -> None:
    """Make `text` the file's whole content atomically (private_fs.write_atomic), with the old file's mode
    and owner (0600 for a new file). On any failure (ENOSPC) the old file is as it was (OSError)."""
    private_dir(path.parent)
    owner = (before.st_uid, before.st_gid) if before is not None and os.geteuid() == 0 else None  # root editing
    write_atomic(path, text, stat.S_IMODE(before.st_mode) if before else FILE_MODE, owner)  # a user's file
