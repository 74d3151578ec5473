"""Processes: what runs on the GPUs, as nvitop lists it (pid, name, the configured server it belongs to,
VRAM, SM%, host CPU and RSS), sortable and filterable. Servers gpudash launched show even where the rig
reports no GPU processes (a sim rig), with their GPU columns as NA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widgets import Static

from gpudash import fmt
from gpudash.records import Snapshot
from gpudash.tui.state import ViewState
from gpudash.tui.widgets.tables import TableView


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


# (title, key): the sort orders `o` cycles through; the biggest first, then by pid
SORTS: tuple[tuple[str, Any], ...] = (
    ("VRAM", lambda r: -(r.vram or 0)),
    ("SM%", lambda r: -(r.sm_pct or 0.0)),
    ("CPU%", lambda r: -(r.cpu_pct or 0.0)),
    ("RSS", lambda r: -(r.rss or 0)),
    ("GPU", lambda r: r.gpu if r.gpu is not None else 1 << 30),
    ("PID", lambda r: r.pid),
)


def process_rows(snap: Snapshot) -> list[ProcRow]:
    """GPU processes joined with the host's view of the same pids; launched servers not on a GPU too."""
    host = {p.pid: p for p in snap.processes}
    rows = []
    for p in snap.gpu_processes:
        h = host.get(p.pid)
        rows.append(ProcRow(p.gpu_index, p.pid, p.name, p.server, p.used_bytes, p.sm_pct,
                            h.cpu_pct if h else None, h.rss if h else None))
    on_gpu = {p.pid for p in snap.gpu_processes}
    rows.extend(ProcRow(None, h.pid, "", h.name, None, None, h.cpu_pct, h.rss)  # the host names it by server
                for h in snap.processes if h.pid not in on_gpu)
    return rows


def shown_rows(rows: list[ProcRow], sort: int, text: str) -> list[ProcRow]:
    """Rows whose name, server or pid contain `text` (any case), in sort order `sort`."""
    needle = text.strip().lower()
    kept = [r for r in rows if not needle or needle in f"{r.pid} {r.name} {r.server or ''}".lower()]
    return sorted(kept, key=lambda r: (SORTS[sort][1](r), r.pid))


class ProcessesView(TableView):
    TITLE = "Processes"
    EMPTY = "no processes on the GPUs"
    COLUMNS = ("GPU", "PID", "name", "server", "VRAM", "SM%", "CPU%", "RSS")

    sort = 0  # index into SORTS
    filter_text = ""

    def action_sort_processes(self) -> None:
        self.sort = (self.sort + 1) % len(SORTS)
        self.show(self.state)

    def action_filter_processes(self) -> None:
        from gpudash.tui.screens.filter import FilterForm

        def done(text: str | None) -> None:
            if text is not None:
                self.filter_text = text.strip()
                self.show(self.state)

        self.app.push_screen(FilterForm("processes whose pid, name or server", self.filter_text), done)

    def draw(self, state: ViewState) -> None:
        snap, sort, text = state.latest, self.sort, self.filter_text
        rows = process_rows(snap) if snap is not None else []
        shown = shown_rows(rows, sort, text)
        title = Text(f"Processes: {len(shown)} of {len(rows)}, sorted by {SORTS[sort][0]} (o: next order)")
        title.append(f"  filter: {text!r} (/: change)" if text else "  (/: filter)",
                     style="bold magenta" if text else "")
        self.query_one(".view-title", Static).update(title)
        self.fill([(fmt.NA if r.gpu is None else r.gpu, r.pid, r.name or fmt.NA,
                    Text(r.server, style="bold") if r.server else fmt.NA, fmt.size(r.vram),
                    fmt.num(r.sm_pct, ".0f", "%"), fmt.num(r.cpu_pct, ".1f", "%"), fmt.size(r.rss))
                   for r in shown])
