"""Ports and health checks: choosing a free port, telling a taken one, waiting for /health to say 200.

llama-server answers 503 ("Loading model") on /health until the model is loaded, then 200; vLLM refuses
connections until loaded, then answers 200. Both reduce to "ready when /health returns 200".
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import httpx

from gpudash.proctree import listens

# How often /health is polled while a server loads; bounds the ready-detection latency.
HEALTH_POLL_S = 0.01


def connect_host(host: str) -> str:
    """The address a client uses to reach a server bound to `host` (wildcards mean this machine)."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def url_host(host: str) -> str:
    """`connect_host` as it goes into a URL (IPv6 addresses in brackets)."""
    h = connect_host(host)
    return f"[{h}]" if ":" in h else h


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now on `host`."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind (host, port) now (SO_REUSEADDR, as servers set it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class NotHealthy(Exception):
    """The server exited or timed out before /health said 200; `exit_code` is set when it exited."""

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, poll_s: float = HEALTH_POLL_S,
                 cancel: threading.Event | None = None, port: int | None = None) -> float:
    """Block until GET `url` returns 200 from `proc`; return the time it did. With `port`, a 200 counts
    only while the listener on that port is `proc`'s or its descendants' (proctree.listens): another
    user's process that took the port first answers too, and must never be taken for the server (it would
    be sent the API key next). Raises NotHealthy on exit, on timeout, or as soon as `cancel` is set (a stop
    must not wait out the health timeout)."""
    deadline = time.monotonic() + timeout_s
    cancel = cancel or threading.Event()
    last = "no answer yet"
    with httpx.Client(timeout=httpx.Timeout(2.0, connect=0.5), trust_env=False) as client:
        while True:
            rc = proc.poll()
            if rc is not None:
                raise NotHealthy(f"exited with code {rc} while loading", exit_code=rc)
            try:
                r = client.get(url)
                if r.status_code == 200 and (port is None or listens(proc.pid, port)):
                    return time.time()
                last = f"HTTP {r.status_code}" if r.status_code != 200 else \
                    f"port {port} answers, but from a process gpudash did not start"
            except httpx.TransportError as err:
                last = type(err).__name__
            if time.monotonic() >= deadline:
                raise NotHealthy(f"did not answer 200 on /health within {timeout_s:g} s (last: {last}); "
                                 "raise its `health_timeout_s` if it needs longer")
            if cancel.wait(poll_s):
                raise NotHealthy("was stopped while loading")

