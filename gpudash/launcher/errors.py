"""The one error the launcher raises for anything a user can cause (bad spec, missing file, port taken)."""

from __future__ import annotations


class LaunchError(Exception):
    """A server could not be started; `server` names it, `cause` is one sentence saying why and what to do."""

    def __init__(self, server: str, cause: str):
        super().__init__(f"server '{server}': {cause}")
        self.server = server
        self.cause = cause
