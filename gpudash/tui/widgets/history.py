"""History: the recorded sessions of the DB, reloaded while the tab is on screen (a chain: load in a worker
-> show -> set_timer), and `e` exports the selected one after asking for a format and a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text

from gpudash import fmt
from gpudash.labels import is_sim_label
from gpudash.runtime.history import ExportError, StoreError, export_recorded, is_action, recorded_sessions
from gpudash.tui import messages as msg
from gpudash.tui.state import ViewState
from gpudash.tui.widgets.tables import TableView
from gpudash.tui.widgets.view import DashView

HISTORY_POLL_S = 2.0  # the sessions list reloads this often while it is on screen


class HistoryView(TableView):
    TITLE = "Recorded sessions (e: export the selected one, up/down: select)"
    EMPTY = "no recorded sessions in this DB"
    COLUMNS = ("id", "started", "ended", "duration", "source", "what", "rows")
    DROP = ("rows", "what", "ended")  # the source stays: it says SIM; ended says interrupted where it is

    sessions: list[Any] = []  # newest first (replaced, never mutated)
    cursor = 0
    _chain = False  # a load is scheduled or under way

    def draw(self, state: ViewState) -> None:
        """The list changes when it is loaded, not with the ticks."""

    def _show_sessions(self) -> None:
        """`what` is the session's note: which command recorded it (gpudash record, bench engine...)."""
        rows = [(s.id, fmt.clock(s.started), fmt.session_end(s.ended, s.state), fmt.duration(s.duration_s),
                 Text(s.source, style="bold yellow" if is_sim_label(s.source) else ""), s.note or fmt.NA,
                 sum(s.rows.values()))
                for s in self.sessions]
        self.fill(rows, self.cursor)

    def action_select(self, step: int) -> None:
        if self.sessions:
            self.cursor = (self.cursor + step) % len(self.sessions)
            self._show_sessions()

    @property
    def selected(self) -> Any:
        return self.sessions[self.cursor] if self.sessions else None

    # ---- the sessions list: a chain while on screen -------------------------------------------------

    def shown(self, previous: DashView | None) -> None:
        if not self._chain:
            self._chain = True
            self._load()

    def _db_path(self) -> str | None:
        feed = self.state.feed
        return feed.db_path if feed is not None else None

    def _load(self) -> None:
        """One link of the chain: load, show, and load again in HISTORY_POLL_S while on screen."""
        db = self._db_path()
        if not self.on_screen:
            self._chain = False
            return
        if db is None or not Path(db).exists():
            self._show_sessions()
            self.set_timer(HISTORY_POLL_S, self._load)
            return

        def load() -> None:
            self.post_message(msg.SessionsLoaded(recorded_sessions(db)))

        self.run_in_thread(load, "history.load", "store")

    def worker_failed(self, name: str) -> None:
        if name == "history.load":
            self._chain = False

    def on_sessions_loaded(self, message: msg.SessionsLoaded) -> None:
        message.stop()
        selected = self.selected.id if self.sessions else None
        # newest first; a server action (`gpudash server sleep|wake`) is no recording: `gpudash history` lists
        # those apart, and their events are on Events
        self.sessions = [s for s in reversed(message.sessions) if not is_action(s)]
        ids = [s.id for s in self.sessions]
        self.cursor = ids.index(selected) if selected in ids else 0  # the selection stays on its row
        if self.is_attached:
            self._show_sessions()
        self.set_timer(HISTORY_POLL_S, self._load)

    # ---- export ---------------------------------------------------------------------------------------

    def action_export(self) -> None:
        """Ask for a format and a folder, then export the selected session."""
        from gpudash.tui.screens.export import ExportForm

        session = self.selected
        if session is None:
            self.notify("nothing to export: no recorded session is selected", severity="warning")
            return
        self.app.push_screen(ExportForm(session.id, self.state.export_dir / f"gpudash-session-{session.id}"),
                             self._export)

    def _export(self, request: Any) -> None:
        if request is None:
            return
        db = self._db_path()

        def export() -> None:
            try:
                _, done = export_recorded(db, request.session, request.fmt, request.folder)
                self.post_message(msg.Exported(True, f"exported session {request.session}: {len(done)} "
                                                     f"{request.fmt} files to {request.folder}"))
            except (ExportError, StoreError) as err:
                self.post_message(msg.Exported(False, str(err)))

        self.run_in_thread(export, "history.export", "store")

    def on_exported(self, message: msg.Exported) -> None:
        message.stop()
        self.notify(message.text, severity="information" if message.ok else "error")
