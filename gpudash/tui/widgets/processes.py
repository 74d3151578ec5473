"""Processes: what runs on the GPUs, as nvitop lists it (GPU, pid, user, VRAM, SM%, host CPU and RSS, the
configured server it belongs to, the command), sortable by any column either way and filterable. Servers
gpudash launched show even where the rig reports no GPU processes (a sim rig), with their GPU columns NA.
A process gpudash supervises is stopped through its supervisor; one the user owns can be sent a signal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widgets import Static

from gpudash import fmt
from gpudash.runtime.control import ServerAction, SignalProcess
from gpudash.records import Snapshot
from gpudash.tui import messages as msg
from gpudash.tui.procinfo import ProcInfo, lookup
from gpudash.tui.state import ViewState
from gpudash.tui.widgets.sorted_rows import KeepsSelection, Sort, filter_and_sort
from gpudash.tui.widgets.tables import TableView
from gpudash.tui.widgets.view import DashView

# htop's first signals, in its order of use: (key, signal, what the dialog calls it)
SIGNALS = (("t", "TERM", "TERM: ask it to exit"), ("i", "INT", "INT: as Ctrl+C"), ("k", "KILL", "KILL: end it now"),
           ("h", "HUP", "HUP"))


@dataclass(frozen=True, slots=True)
class ProcRow:
    gpu: int | None
    pid: int
    name: str
    server: str | None
    vram: int | None
    sm_pct: float | None
    cpu_pct: float | None
    rss: int | None
    user: str = ""
    command: str = ""  # the program's name and its arguments
    program: str = ""  # where the program is (the filter finds a process by its path too)

    def text(self) -> str:
        """What the filter searches: pid, name, user, command, the program's path and server."""
        return f"{self.pid} {self.name} {self.user} {self.command} {self.program} {self.server or ''}".lower()


# The sort orders `o` / `O` step through (the columns of the table); `I` reverses the one in use.
SORTS: tuple[Sort[ProcRow], ...] = (
    Sort("VRAM", lambda r: r.vram, True),
    Sort("SM%", lambda r: r.sm_pct, True),
    Sort("CPU%", lambda r: r.cpu_pct, True),
    Sort("RSS", lambda r: r.rss, True),
    Sort("GPU", lambda r: r.gpu, False),
    Sort("PID", lambda r: r.pid, False),
    Sort("user", lambda r: r.user or None, False),
    Sort("server", lambda r: r.server, False),
    Sort("command", lambda r: r.command or r.name or None, False),
)


def process_rows(snap: Snapshot, info: dict[int, ProcInfo] | None = None) -> list[ProcRow]:
    """GPU processes joined with the host's view of the same pids; launched servers not on a GPU too.
    `info` adds user and command where they were looked up."""
    host = {p.pid: p for p in snap.processes}
    info = info or {}
    rows = []

    def who(pid: int) -> tuple[str, str, str]:
        i = info.get(pid)
        return (i.user, i.command, i.program) if i is not None else ("", "", "")

    for p in snap.gpu_processes:
        h = host.get(p.pid)
        rows.append(ProcRow(p.gpu_index, p.pid, p.name, p.server, p.used_bytes, p.sm_pct,
                            h.cpu_pct if h else None, h.rss if h else None, *who(p.pid)))
    on_gpu = {p.pid for p in snap.gpu_processes}
    rows.extend(ProcRow(None, h.pid, "", h.name, None, None, h.cpu_pct, h.rss, *who(h.pid))  # named by server
                for h in snap.processes if h.pid not in on_gpu)
    return rows


def shown_rows(rows: list[ProcRow], sort: int, text: str, reverse: bool = False) -> list[ProcRow]:
    """Rows whose pid, name, user, command or server contain `text` (any case), in sort order `sort`
    (reversed with `reverse`), ties by pid."""
    return filter_and_sort(rows, SORTS[sort], text, ProcRow.text, lambda r: r.pid, reverse)


def cells(r: ProcRow) -> tuple[Any, ...]:
    """One row as the tables show it (the Overview's short list takes the same cells)."""
    return (fmt.NA if r.gpu is None else r.gpu, r.pid, r.user or fmt.NA, fmt.size(r.vram),
            fmt.num(r.sm_pct, ".0f", "%"), fmt.num(r.cpu_pct, ".1f", "%"), fmt.size(r.rss),
            Text(r.server, style="bold") if r.server else fmt.NA, r.command or r.name or fmt.NA)


class ShowsProcesses(DashView):
    """A view with a process list: it has the users and commands of new pids looked up (live only). The
    answer bubbles up to the App, which redraws whichever view is on screen by then (the one that asked may
    not be: the Overview asks first, and the operator may be on the Processes tab when the answer comes).
    A pid that is gone is forgotten, so when it comes back (reused by another process) it is asked again."""

    def look_up(self, state: ViewState) -> None:
        snap = state.latest
        if snap is None or not state.live:
            return
        pids = {p.pid for p in snap.gpu_processes} | {p.pid for p in snap.processes}
        for pid in state.proc_asked - pids:
            state.proc_asked.discard(pid)
            state.proc_info.pop(pid, None)
        new = sorted(pids - state.proc_asked)
        if new:
            state.proc_asked.update(new)
            self.run_in_thread(lambda: self.post_message(msg.ProcessInfo(lookup(new))), "processes.lookup", "procs")



class ProcessesView(TableView, ShowsProcesses, KeepsSelection):
    TITLE = "Processes"
    EMPTY = "no processes on the GPUs"
    COLUMNS = ("GPU", "PID", "user", "VRAM", "SM%", "CPU%", "RSS", "server", "command")
    DROP = ("RSS", "SM%", "user")  # at 80 columns the command keeps the rest of the line

    sort = 0  # index into SORTS
    reverse = False
    _shown: list[ProcRow] = []

    def draw(self, state: ViewState) -> None:
        snap = state.latest
        self.look_up(state)
        rows = process_rows(snap, state.proc_info) if snap is not None else []
        shown = shown_rows(rows, self.sort, self.filter_text, self.reverse)
        self._shown = shown
        self.follow_selection(self._keys())
        s = SORTS[self.sort]
        order = "biggest first" if s.biggest_first != self.reverse else "smallest first"
        if s.column in ("user", "server", "command"):
            order = "Z to A" if self.reverse else "A to Z"
        title = Text(f"Processes {len(shown)} of {len(rows)}, by {s.column} {order} (o/O: column, I: reverse)")
        self.table.sorted_by(s.column, order in ("biggest first", "Z to A"))
        text = self.filter_text
        title.append(f"  filter {text!r} (/)" if text else "  (/: filter)", style="bold magenta" if text else "")
        self.query_one(".view-title", Static).update(title)
        self.query_one(".empty", Static).update(Text(f"no match for {text!r} (/ changes the filter)") if rows and text
                                                 else self.EMPTY)
        self.fill([cells(r) for r in shown], self.cursor)

    def _keys(self) -> list[tuple[int, int | None]]:
        return [(r.pid, r.gpu) for r in self._shown]  # a process on two GPUs has two rows

    def action_select(self, step: int) -> None:
        if self.step_selection(step, self._keys()):
            self.show(self.state)

    def action_sort_processes(self, step: int = 1) -> None:
        self.sort = (self.sort + step) % len(SORTS)
        self.show(self.state)

    def action_reverse_processes(self) -> None:
        self.reverse = not self.reverse
        self.show(self.state)

    def action_filter_processes(self) -> None:
        self.ask_filter("processes", "pid, name, user, command or server")

    def action_signal_process(self) -> None:
        """`K`, as htop's: a dialog that names the process and offers TERM, INT, KILL and HUP; for a server
        gpudash supervises, stopping it through its supervisor comes first (a signal alone would have the
        supervisor start it again; the controller says so). An attached server's process, and processes of
        other users, are refused at once, saying why (a dialog offering what is then refused said the opposite)."""
        from gpudash.tui.screens.dialogs import Choice, ChoiceScreen

        if not self._shown:
            self.notify("no process selected", severity="warning")
            return
        row = self._shown[self.cursor]
        info = self.state.proc_info.get(row.pid)
        where = f", {row.program}" if row.program and row.program != row.command.split(" ")[0] else ""
        what = f"pid {row.pid} ({row.command or row.name or 'command unknown'}{where}, user {row.user or 'unknown'})"
        spec = self.state.specs.get(row.server) if row.server is not None else None
        if spec is not None and spec.attached:  # gpudash only reads it: nothing here applies (x, t, ... refused)
            self.notify(f"{what} is attached server {row.server}: gpudash only reads it and never stops or signals "
                        "it; do that where it was started (systemd, docker, its shell)", severity="warning",
                        timeout=10)
            return
        supervised = spec is not None
        if not supervised and (info is None or not info.mine):
            self.notify(f"{what}: gpudash signals only the servers it supervises and processes you own",
                        severity="warning", timeout=8)
            return
        choices = [Choice(k, label, name) for k, name, label in SIGNALS] + [Choice("escape", "cancel", "")]
        text = f"{what}. Choose the signal:"
        if supervised:
            choices.insert(0, Choice("x", f"stop {row.server} (stays stopped)", "stop"))
            text = (f"{what} is server {row.server}, which gpudash supervises: x stops it through its supervisor "
                    "and it stays stopped until S on Servers. Or choose a signal:")

        def answered(signal: str | None) -> None:
            if signal == "stop":
                self.propose(ServerAction(row.server, "stop"), confirmed=True)  # type: ignore[arg-type]
            elif signal:
                self.propose(SignalProcess(row.pid, signal, row.command or row.name,
                                           info.started if info is not None else None))

        self.app.push_screen(ChoiceScreen(f"Stop or signal pid {row.pid}?", text, choices), answered)
