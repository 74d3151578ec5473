"""Finding a server's executable and the flags it understands.

The executable comes from the spec's `binary`, else its kind finds one (kinds/).
What flags a binary has is read from its `--help` once per (path, mtime): builds add and rename flags,
and a spec asking for one the binary lacks must fail before anything is started.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from gpudash.config import ServerSpec
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.kinds.base import ServerKind
from gpudash.proctree import run_bounded

# A flag at the start of a help entry: "  -md,   --model-draft FNAME" / "  --enable-prefix-caching, --no-...".
_FLAG_RE = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.-]*)")
# llama.cpp keeps removed flags in its help with this text (and rejects them at run time).
_REMOVED_MARK = "has been removed"

_MAX_ENTRY_INDENT = 6

HELP_TIMEOUT_S = 60.0
HELP_CAP = 8 << 20  # bytes of --help read: vLLM's --help=all is ~0.2 MB; a binary printing without end is cut


@dataclass(frozen=True)
class HelpFlags:
    """The flags one binary's help lists, minus those it says were removed."""

    flags: frozenset[str]
    removed: frozenset[str]

    def supported(self) -> frozenset[str]:
        return self.flags - self.removed


def parse_help(text: str) -> HelpFlags:
    """Flags from `--help` output: every entry line that starts with a dash, split off its description."""
    flags: set[str] = set()
    removed: set[str] = set()
    entry: set[str] = set()
    for line in text.splitlines():
        stripped = line.strip()
        # Entries start near the left margin; description continuation lines are indented far.
        if stripped.startswith("-") and len(line) - len(line.lstrip()) <= _MAX_ENTRY_INDENT:
            # The flag column ends at the first run of 2+ spaces (the description starts there).
            # The flag column ends at the first run of 2+ spaces not following a comma ("-m,    --model").
            head, desc = (re.split(r"(?<![,\s])\s{2,}", stripped, maxsplit=1) + [""])[:2]
            entry = set(_FLAG_RE.findall(head))
            flags |= entry
            if _REMOVED_MARK in desc:
                removed |= entry
        elif stripped and entry and _REMOVED_MARK in stripped:
            removed |= entry
    return HelpFlags(frozenset(flags), frozenset(removed))


_cache: dict[tuple[str, int], HelpFlags] = {}
_cache_lock = threading.Lock()


def binary_flags(kind: ServerKind, binary: str) -> HelpFlags:
    """The flags `binary` supports (cached per path and mtime); raises OSError/RuntimeError if help fails."""
    path = os.path.realpath(binary)
    key = (path, os.stat(path).st_mtime_ns)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    tried = []
    for cmd in kind.help_commands(binary):
        rc, out = run_bounded(cmd, HELP_CAP, HELP_TIMEOUT_S)  # a help that never ends is cut, with its children
        parsed = parse_help(out.decode("utf-8", errors="replace"))
        if parsed.flags:
            with _cache_lock:
                _cache[key] = parsed
            return parsed
        tried.append(f"'{' '.join(cmd)}' ({'cut short' if rc is None else f'exit {rc}'})")
    raise RuntimeError(f"{' and '.join(tried)} listed no flags")


def resolve_binary(spec: ServerSpec) -> str:
    """The executable for a spec, or LaunchError saying where gpudash looked and how to fix it."""
    if spec.binary:
        found = spec.binary if os.sep in spec.binary else shutil.which(spec.binary)
        p = Path(spec.binary).expanduser() if found is None else Path(found)
        if not p.is_file() or not os.access(p, os.X_OK):
            raise LaunchError(spec.name, f"binary '{spec.binary}' is not an executable file; "
                                         "fix `binary` in its [[servers]] entry")
        return str(p)
    return kind_of(spec).find_binary(spec)


def binary_origin(spec: ServerSpec, binary: str) -> str:
    """Where resolve_binary found `binary` for `spec`, in the words doctor prints."""
    return "config binary" if spec.binary else kind_of(spec).binary_origin(binary)
