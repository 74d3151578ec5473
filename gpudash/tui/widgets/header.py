"""The header that is always on screen: source (real GPUs, or SIM + profile in a colour that cannot be
missed), the DB path, whether recording is on, the embedded demo's cost while gpudash runs it, and the
replay position when replaying."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from gpudash.labels import sim_profile_of


def _short_path(path: str, keep: int) -> str:
    """The DB path in `keep` cells, shortened from the left so that the file name survives."""
    home = str(Path.home())
    if path.startswith(home):
        path = "~" + path[len(home):]
    if len(path) <= keep:
        return path
    name = Path(path).name
    return "…" + path[-(keep - 1):] if keep > len(name) else "…" + name[-max(1, keep - 1):]


class SourceHeader(Static):
    source: reactive[str] = reactive("starting…")
    db_path: reactive[str] = reactive("—")
    recording: reactive[bool] = reactive(False)
    position: reactive[str] = reactive("")
    warnings: reactive[int] = reactive(0)  # share warnings this tick (listed in the Split balance view)
    rig: reactive[str] = reactive("")  # the rig's stored label ("nvml", "sim:<profile>"): the SIM badge
    demo: reactive[str] = reactive("")  # what the embedded demo costs ("DEMO 22% CPU"; "": none runs)
    demo_key: reactive[str] = reactive("")  # the key that stops it, said where there is room ("": stopped)

    def render(self) -> Text:
        """Source, the word "simulated" on a sim rig, REC, warnings and the replay position always show;
        the longer words after the SIM badge only when there is room, and the DB path takes what is left
        (the file name last to go). A replay's badge names the session; the rig badge names the rig."""
        width = self.size.width or 120
        replay = self.source.startswith("replay:")
        t = Text(" gpudash ", style="bold reverse")
        t.append("  ")
        if replay:
            session = self.source.removeprefix("replay:").split(" (")[0]
            t.append(f" REPLAY {session} ", style="bold white on blue")
            t.append(" ")
        profile = sim_profile_of(self.rig)
        if profile is not None:
            t.append(f" SIM {profile} ", style="bold black on bright_yellow")
        elif "nvml" in self.source or self.rig == "nvml":
            t.append(" real GPUs (NVML) ", style="bold white on dark_green")
        elif not replay:
            t.append(f" {self.source} ", style="bold white on blue")
        tail = Text("  ")
        if not replay:  # a replay records nothing
            tail.append(" REC ● on " if self.recording else " REC off ",
                        style="bold white on red" if self.recording else "dim")
        if self.demo:  # gpudash started work of its own: say so, what it costs, and how to stop it
            tail.append("  ")
            tail.append(f" {self.demo} ", style="bold black on cyan")
            if self.demo_key:  # its key, unless the DB path's file name would lose its room (the footer has it)
                said = f"({self.demo_key}: stop) "
                if t.cell_len + len(" simulated") + tail.cell_len + len(said) + 24 <= width:
                    tail.append(said, style="bold black on cyan")
        if self.warnings:
            tail.append(f"  ! {self.warnings} share warning{'s' if self.warnings > 1 else ''} ",
                        style="bold black on dark_orange")
        if self.position:
            tail.append(f"  {self.position}", style="bold")
        db = f"  DB {self.db_path}"
        if profile is not None:
            words = " simulated rig, not real GPUs "
            if t.cell_len + len(words) + tail.cell_len + min(len(db), 24) > width:
                words = " simulated"
            t.append(words, style="bold bright_yellow")
        t.append_text(tail)
        room = width - t.cell_len - len("  DB ")
        if room >= 8:
            t.append(f"  DB {_short_path(self.db_path, room)}")
        return t
