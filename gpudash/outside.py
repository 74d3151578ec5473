"""Text that comes from outside gpudash, shown as text.

A server's error body, a process's command line, a Prometheus label, a host name, a field read from a
database file: any of it may hold terminal escape sequences (a title set, a screen clear) or, for Rich and
Textual, markup (`[link=file:///etc/shadow]`), or a secret it echoes (an error body quoting the API key, a
URL with its password). Everything from outside goes through here before a terminal sees it: `printable`
masks secrets (redact.mask_text) and neutralises control characters (shown as their escapes, so nothing
else is lost), and `markup_free` does that and escapes Rich markup too, for text that a Rich or Textual
renderer parses.
"""

from __future__ import annotations

import re

from rich.markup import escape

from gpudash.redact import mask_text

# C0 controls (tab and newline included: a field is one line), DEL, and the C1 controls (ESC's 8-bit
# forms), plus the bidirectional overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _shown(match: re.Match[str]) -> str:
    return match[0].encode("unicode_escape").decode("ascii")


def printable(text: object) -> str:
    """`text` as one line a terminal only displays: each control character as its escape (\\x1b, \\n),
    secrets masked."""
    return _CONTROL.sub(_shown, mask_text(str(text)))


def markup_free(text: object) -> str:
    """`printable(text)` with Rich markup escaped, for text a Rich or Textual renderer reads as markup."""
    return escape(printable(text))
