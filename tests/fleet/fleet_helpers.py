"""Helpers for the fleet tests: a real Prometheus (Debian's 2.42, installed by .ci/run) started on a free
127.0.0.1 port with its config and TSDB in the test's tmp dir, `gpudash` subprocesses, and ending each
process by its pid. Without prometheus/promtool on PATH the tests skip, unless
GPUDASH_REQUIRE_PROMETHEUS=1 (CI) makes that a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpudash.engine.profiles import get_profile
from gpudash.labels import sim_uuid
from gpudash.launcher.health import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_helpers import env  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DOUBLE = REPO / "tests" / "doubles" / "vllm_double.py"
RULES = REPO / "deploy" / "prometheus" / "gpudash-rules.yml"
ALERTS_NOW = REPO / "tests" / "fleet" / "alerts_now.yml"  # fires at once, so a firing alert can be seen


# The GPUs of a box that runs dcgm-exporter and no gpudash.
H100S = [{"gpu": i, "uuid": f"GPU-5e1d0c7a-0000-4000-8000-00000000000{i}", "model": "NVIDIA H100 80GB HBM3",
          "pci_bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0"} for i in range(2)]


def sim_gpus(profile: str) -> list[dict]:
    """A sim rig's GPUs as the dcgm-exporter stand-in takes them (the UUIDs gpudash gives them)."""
    return [{"gpu": i, "uuid": sim_uuid(profile, i), "model": g.name, "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0"}
            for i, g in enumerate(get_profile(profile).gpus)]


@contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[int]:
    """Run an HTTP server of this test in a thread; its port while in the block, shut down after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def raw_port(handle: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A 127.0.0.1 port whose every connection `handle(conn, stop)` gets in a thread of its own (for peers
    that misbehave below HTTP); the port while in the block, every connection closed after."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = srv.accept()[0]
            except OSError:
                continue
            held.append(conn)
            threading.Thread(target=handle, args=(conn, stop), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(timeout=2)
        for conn in held:
            conn.close()
        srv.close()


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("GPUDASH_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"{name} is not on PATH (apt-get install prometheus; see .ci/run)")
        pytest.skip(f"{name} is not on PATH (apt-get install prometheus)")
    return path


def wait_for(check: Callable[[], Any], timeout: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what or check}")


def stop(proc: subprocess.Popen) -> None:
    """End a process this module started, by its pid: SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@dataclass
class PromServer:
    url: str
    proc: subprocess.Popen

    def query(self, expr: str) -> list[dict]:
        doc = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10, trust_env=False).json()
        assert doc["status"] == "success", doc
        return doc["data"]["result"]


def start_prometheus(workdir: Path, jobs: dict[str, list[str]], interval: str = "1s",
                     rules: tuple[Path, ...] = (RULES,), self_scrape: bool = False,
                     port: int | None = None, relabel: dict[str, list[dict]] | None = None) -> PromServer:
    """A Prometheus on 127.0.0.1:`port` (unset: a free one), its config and TSDB in `workdir`; jobs: name ->
    targets; `self_scrape` adds a job "prometheus" scraping this Prometheus (a target with no gpudash metrics);
    `relabel`: job -> its relabel_configs."""
    exe = binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    if self_scrape:
        jobs = {**jobs, "prometheus": [f"127.0.0.1:{port}"]}
    config = {  # JSON is YAML: no YAML writer needed
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(r) for r in rules],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}],
                            **({"relabel_configs": relabel[job]} if relabel and job in relabel else {})}
                           for job, targets in jobs.items()],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))
    log = open(workdir / "prometheus.log", "wb")
    proc = subprocess.Popen([exe, f"--config.file={workdir / 'prometheus.yml'}",
                             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--web.console.templates=", "--web.console.libraries="],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, (workdir / "prometheus.log").read_text()[-2000:]
        try:
            return httpx.get(f"{url}/-/ready", timeout=1, trust_env=False).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, 30, "Prometheus to be ready")
    except BaseException:
        stop(proc)
        raise
    return PromServer(url, proc)


def gpudash(tmp: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from gpudash.cli import main; main()", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env(tmp), cwd=tmp)


@dataclass
class FleetRig:
    prom: PromServer
    targets: dict[str, str]  # instance -> what answers there ("gpudash sim:h200", "vllm", "nothing", ...)
    procs: list[subprocess.Popen]
    tmp: Path

    def instance(self, what: str) -> str:
        """The one target where `what` answers."""
        (inst,) = [i for i, w in self.targets.items() if w == what]
        return inst
