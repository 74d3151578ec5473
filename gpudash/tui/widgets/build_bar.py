"""The line under the header while gpudash builds a llama-server in the background (no llama-server on the
machine, or a CUDA build for a GPU box): what it builds, for which servers, the step, and a progress bar
with the time left. Hidden otherwise; each step is also a line in Events."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import ProgressBar, Static

from gpudash.records import BuildSample


class BuildBar(Horizontal):
    def compose(self) -> ComposeResult:
        yield Static(id="build-text")
        yield ProgressBar(id="build-progress", show_eta=True)

    def show_builds(self, builds: tuple[BuildSample, ...]) -> None:
        """Show the first build in progress, or hide the line when none runs."""
        self.display = bool(builds)
        if not builds:
            return
        b = builds[0]
        steps = f" {b.done or 0}/{b.total}" if b.total and b.total != 100 else ""  # make's totals are percents
        self.query_one("#build-text", Static).update(f"building llama-server ({b.what}) for {b.servers}: "
                                                     f"{b.step}{steps} ")
        bar = self.query_one("#build-progress", ProgressBar)
        if b.total:
            bar.update(total=b.total, progress=b.done or 0)
        else:
            bar.update(total=None)  # an indeterminate bar until compiling reports its steps
