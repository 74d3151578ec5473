"""The exporter as one more untrusted network peer (issue 41.12): idle and slow clients are cut off at their
deadlines, connections beyond the cap are closed at once and counted, and however many sockets a client
opens, a real scrape is served and the recorder keeps every row (it once lost 37 of 523 host rows to
"Too many open files" under 1019 idle sockets). Real sockets against a real sink and a real `gpudash record`."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.records import GpuSample, Snapshot
from gpudash.telemetry.prom_http import ServeLimits
from gpudash.telemetry.prometheus import PrometheusSink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))
from cli_helpers import cmd, env, query  # noqa: E402
from fleet_helpers import wait_for  # noqa: E402
from gpudash.launcher.health import free_port  # noqa: E402

LONG = 60.0  # a deadline no step of a test reaches


def scrape(port: int) -> dict:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def dropped(fams: dict) -> dict[str, float]:
    return {s.labels["reason"]: s.value for s in fams["gpudash_exporter_connections_dropped"].samples
            if s.name.endswith("_total")}


def hung_up(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (waits for its answer: EOF or a reset, never data)."""
    sock.settimeout(30)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


@contextmanager
def idle_sockets(port: int, n: int) -> Iterator[list[socket.socket]]:
    """`n` connections to the port that never send a byte, opened one after another and closed at the end."""
    with ExitStack() as stack:
        socks = []
        for _ in range(n):
            s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            socks.append(s)
        yield socks


@pytest.fixture
def sink_with(request) -> Iterator:
    sinks = []

    def make(**limits) -> PrometheusSink:
        sink = PrometheusSink("127.0.0.1", 0, limits=ServeLimits(**limits))
        sink(Snapshot(1.0, 0, "sim:h200", gpus=(GpuSample(1.0, 0, "GPU-a", "NVIDIA H200", util_pct=1.0),)))
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.close()


def test_beyond_the_cap_the_longest_waiting_connection_is_closed_and_a_scrape_is_served(sink_with) -> None:
    """Ten silent connections against a cap of four: each one beyond the cap closes the connection that has
    waited longest for its request (at once, counted), so the real scrape that comes last is served."""
    sink = sink_with(max_connections=4, idle_timeout_s=LONG, header_timeout_s=LONG)
    before = len(os.listdir("/proc/self/fd"))
    with idle_sockets(sink.port, 10) as socks:
        fams = scrape(sink.port)
        assert "gpudash_gpu_utilization_ratio" in fams
        assert all(hung_up(s) for s in socks[:7])  # 6 pushed out by the later idle ones, 1 by the scrape
        assert all(still_open(s) for s in socks[7:])
    assert dropped(fams) == {"cap": 7, "idle": 0, "header": 0}
    assert fams["gpudash_exporter_connections_max"].samples[0].value == 4
    assert 4 <= fams["gpudash_exporter_connections_open"].samples[0].value <= 2 * 4  # with those being closed
    sink.close()  # hangs up the four it still held: every descriptor of both ends is given back
    wait_for(lambda: len(os.listdir("/proc/self/fd")) <= before, 30, "the server's descriptors closed")


def test_a_silent_client_meets_the_idle_deadline_and_a_dripping_one_the_header_deadline(sink_with) -> None:
    sink = sink_with(max_connections=8, idle_timeout_s=0.5, header_timeout_s=1.5)
    with socket.create_connection(("127.0.0.1", sink.port), timeout=10) as silent:
        assert hung_up(silent)
    with socket.create_connection(("127.0.0.1", sink.port), timeout=10) as drip:
        drip.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for _ in range(600):  # one byte every 0.1 s, each well inside the idle deadline: 60 s of header at most
            try:
                drip.sendall(b"X")
            except OSError:
                closed = True
                break
            drip.settimeout(0.1)
            try:
                if drip.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = True
                break
        assert closed, "a request head dripping a byte at a time was never cut off"
    assert dropped(scrape(sink.port)) == {"cap": 0, "idle": 1, "header": 1}


def _limit_descriptors(n: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


def test_a_flood_of_idle_sockets_starves_neither_the_scrape_nor_the_recorder(tmp_path: Path) -> None:
    """`gpudash record --prometheus` with 128 descriptors, against 400 connections that never send a byte: the
    scrapes made meanwhile are served, and every tick keeps its host and GPU rows with no sweep error."""
    port, db = free_port(), tmp_path / "flood.db"
    proc = subprocess.Popen(cmd("record", "--sim", "8xh20", "--interval", "0.1", "--db", str(db), "--prometheus",
                                str(port), "--quiet", "--duration", "120"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(tmp_path), cwd=tmp_path,
                            preexec_fn=_limit_descriptors(128))
    try:
        wait_for(lambda: _try_scrape(port), 60, "the recorder's first scrape")
        with idle_sockets(port, 400):
            start = _ticks(db)
            wait_for(lambda: _ticks(db) >= start + 20, 60, "20 ticks recorded under the flood")
            served = [scrape(port) for _ in range(3)]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert all("gpudash_gpu_utilization_ratio" in fams for fams in served)
    assert dropped(served[-1])["cap"] >= 400 - served[-1]["gpudash_exporter_connections_max"].samples[0].value
    ticks = query(db, "SELECT count(*) FROM ticks")[0][0]
    assert query(db, "SELECT count(DISTINCT tick) FROM host_samples")[0][0] == ticks
    assert query(db, "SELECT count(*) FROM gpu_samples")[0][0] == 8 * ticks
    assert query(db, "SELECT errors FROM ticks WHERE errors IS NOT NULL AND errors NOT IN ('', '[]')") == []


def _try_scrape(port: int) -> bool:
    try:
        return "gpudash_gpu_utilization_ratio" in scrape(port)
    except httpx.TransportError:
        return False


def _ticks(db: Path) -> int:
    try:
        return query(db, "SELECT count(*) FROM ticks")[0][0]
    except Exception:  # not created yet
        return 0
