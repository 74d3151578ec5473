"""The one interface every tab's widget has: the app hands it the view state, and the view owns the rest
(its selection, its own keys, the polls it runs while on screen), as nvitop's screens own their selection.

How to add a view (a tab):
1. Write a module under `gpudash/tui/widgets/` with a `DashView` subclass; copy the nearest neighbour
   (`TableView` in tables.py for a title, a table and an empty line; `OverviewView` for free-form lines).
   Implement `draw(state)`: it is called with the app's `ViewState` on every tick while the tab is on
   screen (and once when it comes on screen). Keep whatever the view selects on the view itself.
2. Add one row to `VIEWS` in `gpudash/tui/actions.py`: `View("fleet", "Fleet", FleetView)`. Its number
   key, its tab and its place in the help come from that row.
3. Its own keys are `action_<name>` methods on the view, and one `Action(..., target=FleetView)` row each
   in `ACTIONS`: such a key works and shows in the footer only where the view on screen is a `target`.
   Up/down run the view's `action_select(step)`.
4. A change goes up as `self.propose(command)`; blocking work runs in `self.run_in_thread(fn, name)` and
   posts a message back to the view (a failure reaches the app's one error handler).
5. tests/tui/test_snapshots.py snapshots every VIEWS row at 80x24: run that test once with
   --snapshot-update, read the new SVG's text, and commit it.
"""

from __future__ import annotations

from typing import Any, Callable

from textual.containers import Vertical
from textual.worker import Worker, WorkerState

from gpudash.runtime.control import Command
from gpudash.tui import messages as msg
from gpudash.tui.state import ViewState


class DashView(Vertical):
    """One tab's widget. `state` is the ViewState it was last drawn from (an empty one before the first)."""

    def __init__(self, *children: Any, id: str | None = None) -> None:
        super().__init__(*children, id=id)
        self.state = ViewState()

    KEYS_FOLLOW_STATE = False  # True: which keys it offers depends on what it shows (the app asks `offers`)

    def offers(self, method: str) -> bool:
        """Whether the footer offers this view's action `method` now (its key still answers, saying why not)."""
        return True

    def show(self, state: ViewState) -> None:
        """Draw `state` (the app calls this for the view on screen only)."""
        self.state = state
        self.draw(state)

    def draw(self, state: ViewState) -> None:
        raise NotImplementedError

    @property
    def on_screen(self) -> bool:
        """Whether this view's tab is the one shown (its polls stop once it is not)."""
        return self.is_attached and self.parent is not None and self.parent.display

    def shown(self, previous: DashView | None) -> None:
        """The tab came on screen after `previous`: take over a selection both views have (nvitop hands the
        selected process from screen to screen), start polls that run while on screen."""

    def action_select(self, step: int) -> None:
        """Up/down: move this view's selection by `step` (views without one ignore it)."""

    filter_text = ""  # what a shown row must contain, in views with a `/` filter (empty: every row)

    def ask_filter(self, rows: str, fields: str) -> None:
        """`/`: ask for the text that `rows` must contain in one of `fields`, then draw again."""
        from gpudash.tui.screens.filter import FilterForm

        def done(text: str | None) -> None:
            if text is not None:
                self.filter_text = text.strip()
                self.show(self.state)

        self.app.push_screen(FilterForm(rows, fields, self.filter_text), done)

    def propose(self, command: Command | None, confirmed: bool = False) -> None:
        """Hand a change to the app, which applies it or asks first (a form that was cancelled gives None);
        `confirmed`: this view's own dialog said what it does, and was answered."""
        if command is not None:
            self.post_message(msg.Propose(command, confirmed))

    def run_in_thread(self, fn: Callable[[], None], name: str, group: str = "default") -> None:
        """Blocking work on a named thread worker of this view; it posts its result as a message."""
        self.run_worker(fn, name=name, group=group, thread=True, exit_on_error=False)

    def worker_failed(self, name: str) -> None:
        """One of this view's workers failed (the app reports it): stop what depended on it."""

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.worker_failed(event.worker.name)
            self.post_message(msg.WorkerFailed(event.worker.name, event.worker.error))


def cycle(names: list[Any], current: Any, step: int) -> Any:
    """The item `step` places from `current` in `names`, wrapping; from nothing, the first."""
    i = names.index(current) if current in names else -step
    return names[(i + step) % len(names)]
