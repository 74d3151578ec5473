"""Why a llama-server build did not happen, as one sentence for the user."""

from __future__ import annotations


class LlamaBuildError(Exception):
    """A build that cannot start or failed; the message says what and how to fix it."""


class LlamaSourceError(LlamaBuildError):
    """The source given to a build (--source, [llama] source) is not one gpudash builds from: a usage error."""
