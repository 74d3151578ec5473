"""Changes from the keyboard, one ChangeFlow per app: forms build a command, a change that re-launches a
server is confirmed in a dialog that says what it will do, and at most one such change waits as
*pending* (shown in the header and footer, applied with `a`, discarded with Esc). A new one replaces it
only after asking, quitting with one asks too, and every discard is recorded as an event.

Changes that re-launch nothing (engine knobs, a shard size, recording) apply at once and leave the
pending one alone.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Protocol

from gpudash.runtime.control import Command, Controller, ServerAction, SetShare, SetSplit, describe, relaunches
from gpudash.records import Event
from gpudash.tui import messages as msg
from gpudash.tui.actions import BY_ID, Action
from gpudash.tui.screens.dialogs import Choice, ChoiceScreen
from gpudash.tui.state import ViewState


class ChangeHost(Protocol):
    """What a ChangeFlow uses of the app that owns it (the app imports this module, so not the app itself)."""

    state: ViewState

    @property
    def controller(self) -> Controller | None: ...
    def in_thread(self, fn: Any, name: str, group: str = "default") -> None: ...
    def key_of(self, a: Action) -> str: ...
    def notify(self, message: str, **kwargs: Any) -> None: ...
    def push_screen(self, screen: Any, callback: Any = None, **kwargs: Any) -> Any: ...
    def refresh_keys(self) -> None: ...
    def refresh_views(self) -> None: ...

LATER = Choice("l", "later (stays pending)", "later")


def consequence(command: Command, gpus: list[int] | None = None) -> tuple[str, str]:
    """(dialog title, what happens) in the words of this action: a stop is not a re-launch."""
    on = f" on GPUs {','.join(map(str, gpus))}" if gpus else ""
    match command:
        case SetSplit(server, ratios):
            ts = ",".join(f"{r:g}" for r in ratios)
            return (f"Re-launch {server} with split -ts {ts}{on}?",
                    f"{server} stops serving, starts again with -ts {ts}, and serves again once it is healthy.")
        case SetShare(server, share):
            return (f"Re-launch {server} with memory share {share:g}?",
                    f"{server} stops serving, starts again holding at most {share:g} of each of its GPUs' "
                    "memory, and serves again once it is healthy.")
        case ServerAction(server, "stop"):
            return (f"Stop {server}?",
                    f"{server} stops serving and stays stopped until you start it again (S on Servers).")
        case ServerAction(server, "restart"):
            return (f"Restart {server}?",
                    f"{server} stops serving, starts again with the same settings, and serves again once "
                    "it is healthy.")
    return f"{describe(command)}?", f"This will {describe(command)}."


class ChangeFlow:
    """The pending change of one app, and the dialogs around it; the app's footer and header show it."""

    def __init__(self, app: ChangeHost) -> None:
        self.app = app
        self.pending: Command | None = None

    def _choice(self, action_id: str, label: str, value: str) -> Choice:
        """A dialog answer on the key of one of the app's actions (after [keys] remaps), named the way
        the footer names it, so that `a` in the footer is `a` in the dialog."""
        a = BY_ID[action_id]
        return Choice(self.app.keys.get(a.id, a.key), label, value, self.app.key_of(a))

    def propose(self, command: Command | None, confirmed: bool = False) -> None:
        """A form's or a key's command: apply it, or (for a re-launch) confirm it first, unless the dialog
        that asked for it said what it does (`confirmed`); the pending change, if any, stays."""
        if command is None:
            return
        if confirmed or not relaunches(command):
            self._run_apply(command)
            return
        old = self.pending
        if old is None or old == command:
            self._confirm(command)
            return
        text = f"Pending: {describe(old)}\nNew:     {describe(command)}\nOnly one change waits at a time."
        self.app.push_screen(ChoiceScreen("Replace the pending change?", text, [
            self._choice("apply", "replace it with the new one", "replace"),
            self._choice("discard", "keep the pending one, drop the new one", "keep"),
        ]), partial(self._replace_answered, old, command))

    def _gpus_of(self, command: Command) -> list[int] | None:
        """The GPUs a server change concerns, for the dialog's title."""
        specs = self.app.state.specs
        if isinstance(command, (SetSplit, SetShare)) and command.server in specs:
            return self.app.state.server_gpus(specs[command.server])
        return None

    def _replace_answered(self, old: Command, new: Command, answer: str | None) -> None:
        if answer == "replace":
            self._discard(old, f"replaced by: {describe(new)}")
            self._set_pending(None)
            self._confirm(new)
        else:
            self._discard(new, f"the pending change was kept: {describe(old)}")

    def _confirm(self, command: Command) -> None:
        title, text = consequence(command, self._gpus_of(command))
        self._set_pending(command)
        choices = [self._choice("apply", "apply now", "apply"), LATER, self._choice("discard", "discard", "discard")]
        self.app.push_screen(ChoiceScreen(title, text, choices), partial(self._confirmed, command))

    def _confirmed(self, command: Command, answer: str | None) -> None:
        if self.pending != command:
            return  # a concurrent change of the slot (it cannot happen from the keyboard)
        if answer == "apply":
            self._run_apply(command)
        elif answer == "later":
            self.app.notify(f"pending: {describe(command)} ({self.app.key_of(BY_ID['apply'])}: apply, "
                            f"{self.app.key_of(BY_ID['discard'])}: discard)")
        else:
            self._set_pending(None)
            self._discard(command, "cancelled in the confirmation dialog")

    def apply_pending(self) -> None:
        command = self.pending
        if command is None:
            self.app.notify("nothing pending: changes that re-launch a server wait here when you choose 'later'")
            return
        self._run_apply(command)

    def discard_pending(self) -> None:
        command = self.pending
        if command is None:
            return
        self._set_pending(None)
        self._discard(command, "discarded with Esc")

    def _set_pending(self, command: Command | None) -> None:
        self.pending = command
        self.app.refresh_keys()

    def _discard(self, command: Command, reason: str) -> None:
        """Every dropped change is said and is an event (through the controller, so it reaches the store)."""
        self.app.notify(f"discarded: {describe(command)}")
        controller = self.app.controller
        if controller is not None:
            controller.discard(command, reason)
            return
        self.app.state.events.append(Event(time.time(), "keyboard", "change.discarded", describe(command),
                                           new=describe(command), reason=reason))
        self.app.refresh_views()

    def _run_apply(self, command: Command) -> None:
        if self.pending == command:
            self._set_pending(None)
        self.app.notify(f"applying: {describe(command)}…")
        self.app.in_thread(partial(self._apply_blocking, command), f"control.apply.{type(command).__name__}", "control")

    def _apply_blocking(self, command: Command) -> None:
        post, controller = self.app.post_message, self.app.controller
        if controller is None:
            post(msg.Applied(False, "no live rig to change (replay, or still starting)", describe(command)))
            return
        res = controller.apply(command)
        post(msg.Applied(res.ok, res.reason, describe(command)))
        post(msg.SpecsChanged(controller.specs()))
        post(msg.KnobsChanged(controller.knobs()))

    def confirm_quit(self, quit_now: Any) -> None:
        """`q`: quit, but with a change pending ask first (quitting discards it, as an event)."""
        command = self.pending
        if command is None:
            quit_now()
            return

        def answered(answer: str | None) -> None:
            if answer == "quit":
                self._set_pending(None)
                self._discard(command, "discarded on quit")
                quit_now()

        self.app.push_screen(ChoiceScreen("Quit with a change pending?",
                                      f"Pending: {describe(command)}\nQuitting discards it; nothing was applied.",
                                      [self._choice("quit", "quit and discard it", "quit"),
                                       self._choice("discard", "stay", "stay")]), answered)
