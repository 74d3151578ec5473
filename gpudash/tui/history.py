"""History and export, mixed into GpudashApp: the History tab's sessions list reloads itself while it is on
screen (a chain: load in a worker -> show -> set_timer), and `e` exports a session after asking for a
format and a folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudash.tui import messages as msg
from gpudash.tui.widgets.tables import HistoryView

HISTORY_POLL_S = 2.0  # the History tab reloads the sessions list this often while it is on screen


class HistoryControls:
    """Uses the app's `info`, `controller`, `export_dir`, `sessions`, `session_cursor` and `_history_chain`."""

    sessions: list[Any]
    session_cursor: int
    _history_chain: bool
    export_dir: Path

    if TYPE_CHECKING:  # provided by the app
        info: Any
        controller: Any
        active_view: str

        def _alive(self) -> bool: ...

        def _worker(self, fn: Any, name: str, group: str = "default") -> None: ...

        def query_one(self, selector: Any, expect_type: Any = None) -> Any: ...

        def set_timer(self, delay: float, callback: Any) -> Any: ...

        def post_message(self, message: Any) -> bool: ...

        def push_screen(self, screen: Any, callback: Any = None) -> Any: ...

        def notify(self, message: str, **kwargs: Any) -> None: ...

    def _db_path(self) -> str | None:
        return self.info.db_path if self.info is not None else None

    def _load_sessions(self) -> None:
        """One link of the History chain: load, show, and load again in HISTORY_POLL_S while on screen."""
        db = self._db_path()
        if not self._alive() or self.active_view != "history":
            self._history_chain = False
            return
        if db is None or not Path(db).exists():
            self.query_one(HistoryView).show_sessions([], 0)
            self.set_timer(HISTORY_POLL_S, self._load_sessions)
            return

        def load() -> None:
            from gpudash.store import Store

            store = Store.open(db, writing=False)
            try:
                self.post_message(msg.SessionsLoaded(store.sessions()))
            finally:
                store.close()

        self._worker(load, "history.load", "store")

    def on_sessions_loaded(self, message: msg.SessionsLoaded) -> None:
        selected = self.sessions[self.session_cursor].id if self.sessions else None
        self.sessions = list(reversed(message.sessions))  # newest first
        ids = [s.id for s in self.sessions]
        self.session_cursor = ids.index(selected) if selected in ids else 0  # the selection stays on its row
        if self._alive():
            self.query_one(HistoryView).show_sessions(self.sessions, self.session_cursor)
        self.set_timer(HISTORY_POLL_S, self._load_sessions)

    def action_export(self) -> None:
        """Ask for a format and a folder, then export the selected session (History) or the recording."""
        from gpudash.tui.screens.export import ExportForm

        if self.active_view == "history" and self.sessions:
            sid = self.sessions[self.session_cursor].id
        elif self.controller is not None and self.controller.recorder is not None \
                and self.controller.recorder.session_id is not None:
            sid = self.controller.recorder.session_id
        else:
            self.notify("nothing to export: open History (7) and select a recorded session", severity="warning")
            return
        self.push_screen(ExportForm(sid, self.export_dir / f"gpudash-session-{sid}"), self._export)

    def _export(self, request: Any) -> None:
        if request is None:
            return
        db = self._db_path()

        def export() -> None:
            from gpudash.store import Store
            from gpudash.store.export import ExportError, export_session

            store = Store.open(db, writing=False)
            try:
                done = export_session(store, request.session, request.fmt, request.folder)
                self.post_message(msg.Exported(True, f"exported session {request.session}: {len(done)} "
                                                     f"{request.fmt} files to {request.folder}"))
            except ExportError as err:
                self.post_message(msg.Exported(False, str(err)))
            finally:
                store.close()

        self._worker(export, "history.export", "store")

    def on_exported(self, message: msg.Exported) -> None:
        self.notify(message.text, severity="information" if message.ok else "error")

