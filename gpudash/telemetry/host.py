"""Host telemetry through psutil: CPU and memory, NUMA nodes, and CPU/RSS of the processes gpudash
launched plus gpudash itself (so its own overhead is visible next to the servers it watches)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from gpudash.records import HostSample, ProcessSample


def numa_node_count(sys_root: Path = Path("/sys/devices/system/node")) -> int | None:
    """NUMA nodes the kernel exposes, or None where /sys does not say (non-Linux, containers)."""
    try:
        nodes = [p for p in sys_root.iterdir() if p.name.startswith("node") and p.name[4:].isdigit()]
    except OSError:
        return None
    return len(nodes) or None


class HostSource:
    """Yields `host` and `processes`. CPU percentages are since the previous poll (psutil semantics),
    so the first poll reports 0 for processes it has just started watching. gpudash's own CPU is read
    from its process CPU clock (every thread's nanoseconds on a CPU), not from /proc's 10 ms ticks:
    at a 1 s tick those made a 2.5% process read 1-4%."""

    name = "host"

    def __init__(self, pids: Callable[[], dict[int, str]] | None = None) -> None:
        self._pids = pids or dict
        self._procs: dict[int, psutil.Process] = {}
        self._self = psutil.Process(os.getpid())
        self._own_mark = (time.monotonic(), time.process_time())
        psutil.cpu_percent(None)
        self._numa = numa_node_count()

    def _process(self, pid: int) -> psutil.Process | None:
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = psutil.Process(pid)
                proc.cpu_percent(None)
            except psutil.Error:
                return None
            self._procs[pid] = proc
        return proc

    def _own_cpu(self) -> float | None:
        """% of one core this process used since the previous poll (all its threads)."""
        now, used = time.monotonic(), time.process_time()
        (then, before), self._own_mark = self._own_mark, (now, used)
        return (used - before) / (now - then) * 100 if now > then else None

    def poll(self) -> dict[str, object]:
        own_cpu = self._own_cpu()
        ts = time.time()
        vm = psutil.virtual_memory()
        host = HostSample(ts=ts, cpu_pct=psutil.cpu_percent(None), mem_used=vm.total - vm.available,
                          mem_total=vm.total, numa_nodes=self._numa, gpudash_cpu_pct=own_cpu,
                          gpudash_rss=self._self.memory_info().rss, gpudash_pid=self._self.pid)
        watched = self._pids()
        samples = []
        for pid, name in sorted(watched.items()):
            proc = self._process(pid)
            cpu = rss = None
            if proc is not None:
                try:
                    with proc.oneshot():
                        cpu, rss = proc.cpu_percent(None), proc.memory_info().rss
                except psutil.Error:
                    self._procs.pop(pid, None)
            samples.append(ProcessSample(ts=ts, pid=pid, name=name, cpu_pct=cpu, rss=rss))
        for gone in set(self._procs) - set(watched):
            del self._procs[gone]
        return {"host": host, "processes": tuple(samples)}

    def close(self) -> None:
        self._procs.clear()
