"""The header that is always on screen: source (real GPUs, or SIM + profile in a colour that cannot be
missed), the DB path, whether recording is on, and the replay position when replaying."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from gpudash.rig import sim_profile_of


def _short_path(path: str, keep: int = 36) -> str:
    """The DB path, shortened from the left so the header stays on one line (the file name survives)."""
    home = str(Path.home())
    if path.startswith(home):
        path = "~" + path[len(home):]
    return path if len(path) <= keep else "…" + path[-(keep - 1):]


class SourceHeader(Static):
    source: reactive[str] = reactive("starting…")
    db_path: reactive[str] = reactive("—")
    recording: reactive[bool] = reactive(False)
    position: reactive[str] = reactive("")
    pending: reactive[str] = reactive("")
    warnings: reactive[int] = reactive(0)  # share warnings this tick (listed in the Split balance view)
    rig: reactive[str] = reactive("")  # the rig's stored label ("nvml", "sim:<profile>"): the SIM badge

    def render(self) -> Text:
        t = Text(" gpudash ", style="bold reverse")
        t.append("  ")
        if self.source.startswith("replay:"):
            t.append(f" REPLAY {self.source.removeprefix('replay:')} ", style="bold white on blue")
            t.append(" ")
        profile = sim_profile_of(self.rig)
        if profile is not None:
            t.append(f" SIM {profile} ", style="bold black on bright_yellow")
            t.append(" simulated rig, not real GPUs ", style="bold bright_yellow")
        elif "nvml" in self.source:
            t.append(" real GPUs (NVML) ", style="bold white on dark_green")
        elif not self.source.startswith("replay:"):
            t.append(f" {self.source} ", style="bold white on blue")
        t.append("  ")
        t.append(" REC ● on " if self.recording else " REC off ",
                 style="bold white on red" if self.recording else "dim")
        t.append(f"  DB {_short_path(self.db_path)}")
        if self.warnings:
            t.append(f"  ! {self.warnings} share warning{'s' if self.warnings > 1 else ''} ",
                     style="bold black on dark_orange")
        if self.position:
            t.append(f"  {self.position}", style="bold")
        if self.pending:
            t.append(f"  pending: {self.pending} (a: apply)", style="bold magenta")
        return t
