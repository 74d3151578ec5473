"""Everything `gpudash launch` / `gpudash serve` run on the launcher side, wired together once.

The configured servers (with none configured: the inference servers found on the GPUs, attached, and
only on an idle box the embedded demo), their supervisor, the one /metrics scraper, the probe workload
and a llama-server build in the background when one is wanted (launcher/llama/autobuild.py): servers that
wait for it start once it is built. The caller adds `sources` to its Sampler.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import platformdirs

from gpudash.config import APP_NAME, Config, ServerSpec
from gpudash.runtime.demo import default_servers
from gpudash.launcher.discovery import find_servers, local_address
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.llama.autobuild import BackgroundBuild, CudaAutoBuild, plan_missing
from gpudash.telemetry.servers import ServerSource
from gpudash.launcher.probe.runner import ProbeRunner
from gpudash.launcher.supervisor import Pushable, Supervisor
from gpudash.preload.knobs import file_knobs
from gpudash.records import Event


def default_log_dir() -> Path:
    """Where server logs go when the caller does not say: the platformdirs user log dir's servers/."""
    return Path(platformdirs.user_log_dir(APP_NAME)) / "servers"


class LaunchStack:
    """Supervisor + ServerSource + ProbeRunner for one config; `start()` launches, `close()` stops all."""

    def __init__(self, config: Config, inbox: Pushable, log_dir: Path | None = None,
                 gpu_memory: Callable[[], dict[int, int]] | None = None,
                 gpu_pids: Callable[[], list[tuple[int, int]]] | None = None):
        """`gpu_pids` lists the real GPUs' processes ((GPU, pid) pairs, NVML's): with no [[servers]]
        configured, inference servers found among them are attached instead of starting the demo."""
        self.found = find_servers(gpu_pids()) if gpu_pids is not None and not config.servers else []
        self.found = [f for f in self.found if f.answers]
        self.demo = config.demo and not config.servers and not self.found
        if config.servers:
            self.specs = list(config.servers)
        elif self.found:  # a box that serves already: watch what runs, start nothing on its GPUs
            self.specs = [ServerSpec(name=f.name, kind=f.kind, url=f.url) for f in self.found]
            for f in self.found:
                inbox.push(Event(ts=time.time(), actor="launcher", kind="server.found", target=f.name,
                                 new={"pid": f.pid, "url": f.url, "gpus": list(f.gpus)},
                                 reason="attached instead of starting the demo: this box already serves"))
        else:
            self.specs = default_servers(config) if self.demo else []
        if config.llama.binary is not None:  # [llama] binary: for every llama.cpp server naming none
            self.specs = [s.model_copy(update={"binary": str(config.llama.binary)})
                          if kind_of(s).runs_llama_build and not s.binary and not s.attached else s
                          for s in self.specs]
        self.supervisor = Supervisor(self.specs, inbox, log_dir or default_log_dir(), gpu_memory=gpu_memory,
                                     preload_knobs=file_knobs(config.engine),
                                     log_max_bytes=config.logs.server_max_bytes)
        self.source = ServerSource(self.supervisor, gpu_pids=gpu_pids)
        self.probe = ProbeRunner(self.supervisor, config.probe, inbox) if config.probe.enabled else None
        self.build: BackgroundBuild | None = plan_missing(self.specs, config.llama, inbox, self._start_built)
        if self.build is None and config.llama.cuda_build == "auto":
            self.build = CudaAutoBuild.plan(self.specs, config.llama.source, inbox, self._relaunch_if_running)
        self.waiting = set(self.build.names) if self.build is not None and self.build.runs_now == "none" else set()

    def notes(self) -> list[str]:
        """What the header says once about the servers: found ones attached instead of the demo, and that
        the GPU views show this box's GPUs only when an attached server runs on another host."""
        out = []
        if self.found:
            out.append(f"no [[servers]] configured: attached to {len(self.found)} server(s) found on the GPUs "
                       f"({', '.join(f'{f.name} at {f.url}' for f in self.found)}) instead of starting the demo")
        if self.waiting:
            out.append(f"no llama-server here: one is being built for {', '.join(sorted(self.waiting))}, "
                       f"which start(s) when it is ready (progress under the header, steps in Events)")
        remote = [s.name for s in self.specs if s.attached and not local_address(str(s.url))]
        if remote:
            out.append(f"{', '.join(remote)} run(s) on another host: the GPU views show this box's GPUs only")
        return out

    def _start_built(self, name: str) -> None:
        """Start a server that waited for the llama-server build (LaunchError if it cannot start)."""
        self.waiting.discard(name)
        self.supervisor.start(name)

    def _relaunch_if_running(self, name: str) -> None:
        """Move a server onto the new llama-server build, unless the operator stopped it (or it never started)."""
        if any(s.server == name and s.state.running for s in self.supervisor.states()):
            self.supervisor.restart(name)

    @property
    def sources(self) -> list[ServerSource | BackgroundBuild]:
        return [self.source] + ([self.build] if self.build is not None else [])

    def start(self) -> None:
        """Start a background llama-server build if one is wanted, the servers that do not wait for it in
        order, each healthy before the next (LaunchError on the first that fails; earlier ones keep
        running), then the probe."""
        if self.build is not None:
            self.build.start()
        for spec in self.specs:  # attached ones are only read
            if not spec.attached and spec.name not in self.waiting:
                self.supervisor.start(spec.name)
        if self.probe is not None:
            self.probe.start()

    def close(self) -> None:
        """Stop a build still compiling, the probe, then every server (no process left behind), then the scraper."""
        if self.build is not None:
            self.build.stop()
        if self.probe is not None:
            self.probe.stop()
        self.supervisor.stop_all()
        self.source.close()
