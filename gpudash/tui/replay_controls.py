"""Replay's playback chain and keys (pause, step, seek, speed), mixed into GpudashApp: a replay paces
recorded ticks with timers, like the live feed's chain, and seeking rebuilds the view state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudash.tui.feeds import FeedInfo, Player
from gpudash.tui.state import ViewState

SEEK_TICKS = 10  # how far one seek key moves


class ReplayControls:
    """Uses the app's `player`, `state`, `info`, `refresh_views()` and `set_timer()`."""

    player: Player | None
    state: ViewState
    info: FeedInfo | None

    if TYPE_CHECKING:  # provided by the app (a runtime stub here would shadow Textual's set_timer)
        def refresh_views(self) -> None: ...

        def set_timer(self, delay: float, callback: Any) -> Any: ...

    def _replay_tick(self) -> None:
        """One step of the playback chain: show the next tick, then schedule the one after."""
        p = self.player
        if p is None or p.paused:
            return
        snap = p.step()
        if snap is not None:
            self.state.ingest(snap)
            self.refresh_views()
        if not p.done:
            self.set_timer(p.delay_to_next(), self._replay_tick)
        else:
            self.refresh_views()

    def action_replay_pause(self) -> None:
        if self.player is None:
            return
        self.player.paused = not self.player.paused
        if not self.player.paused:
            self._replay_tick()
        self.refresh_views()

    def action_replay_step(self) -> None:
        if self.player is None:
            return
        self.player.paused = True
        snap = self.player.step()
        if snap is not None:
            self.state.ingest(snap)
        self.refresh_views()

    def action_replay_seek(self, direction: int) -> None:
        if self.player is None or not self.player.snaps:
            return
        self.seek_to(self.player.index + direction * SEEK_TICKS)

    def seek_to(self, index: int) -> None:
        """Show tick `index` as it was: plots from the ticks before it, events up to that moment."""
        p = self.player
        if p is None or not p.snaps:
            return
        i = p.seek(index)
        self.state = ViewState()  # from the recorded settings, moved on by the events up to tick i
        if self.info is not None:
            self.state.specs, self.state.knobs = dict(self.info.specs), dict(self.info.knobs)
        self.state.ingest_all(p.snaps[: i + 1])
        self.refresh_views()

    def action_replay_speed(self, up: bool) -> None:
        if self.player is not None:
            self.player.faster(up)
            self.refresh_views()
