"""Inference servers this box runs that gpudash did not start: found from the GPUs' process lists and
each process's command line (/proc/PID/cmdline, read with psutil), and, where asked, from the command
lines of every local process (a llama-server on the CPU, or on a box whose GPUs gpudash cannot see).

A GPU process is a server, or a worker of one (vLLM's EngineCore runs under `vllm serve`), so the process
and its ancestors are matched against every kind's command line. Its address comes from its --host/--port,
else its kind's default port, and one GET /health says whether it answers there. A server in a container
(another PID namespace, a published port gpudash cannot see) may not answer at that address: it is listed
with its pid and a hint to give its `url`.

Any local user can name a process `llama-server` and give it any arguments (`--port ²`, a 5000-digit port,
a --host with control characters or bytes that are not UTF-8): a command line whose address cannot be a
server's is skipped, never raised.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import psutil

from gpudash.launcher.health import url_host
from gpudash.launcher.kinds import kind_running
from gpudash.launcher.scrape_http import Scraper, ScrapeError

HEALTH_TIMEOUT_S = 0.5
# Ancestors looked at above a GPU process (a vLLM worker sits one or two below `vllm serve`).
MAX_ANCESTORS = 4


@dataclass(frozen=True)
class Found:
    """A server process seen on the GPUs: its kind, where it listens, and whether it answered there."""

    pid: int
    kind: str
    cmdline: tuple[str, ...]
    url: str
    gpus: tuple[int, ...]
    answers: bool | None  # GET /health said 200 (None: not asked yet)
    hint: str | None = None  # what to do when its address cannot be reached from here
    gpudash_pid: int | None = None  # the gpudash (a TUI's demo, `launch`) that started it, if one did

    @property
    def name(self) -> str:
        """A [[servers]] name for it that survives a restart: where it listens, `host:port` (its pid changes
        each time it starts, and a name made from it started a new series each time)."""
        return address_name(self.url)


def address_name(url: str) -> str:
    """`host:port` of a server's base URL (an IPv6 host without its brackets), the name a found server goes by."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def nvml_gpu_pids() -> list[tuple[int, int]]:
    """(GPU index, pid) of every process on this machine's GPUs, as NVML lists them ([] without a driver)."""
    from gpudash.gpu import nvml
    from gpudash.gpu.device import devices

    if nvml.driver_available() is not None:
        return []
    return [(p.gpu_index, p.pid) for d in devices() for p in d.processes(0.0, {})]


def cmdline_of(pid: int) -> tuple[str, ...] | None:
    """A process's command line, or None when it is gone or not readable."""
    try:
        return tuple(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return None


def server_process(pid: int, cmdline: Mapping[int, tuple[str, ...]] | None = None
                   ) -> tuple[int, tuple[str, ...]] | None:
    """(pid, command line) of the server `pid` is, or runs under; None when neither it nor an ancestor is
    one. `cmdline` maps pids to command lines already known (tests give a fake process list)."""
    for _ in range(MAX_ANCESTORS + 1):
        words = (cmdline or {}).get(pid) or cmdline_of(pid)
        if words and kind_running(list(words)) is not None:
            return pid, words
        try:
            pid = psutil.Process(pid).ppid()
        except (psutil.Error, OSError):
            return None
        if pid <= 1:
            return None
    return None


def started_by_gpudash(pid: int) -> int | None:
    """The pid of the gpudash process that started server `pid` (its parent runs `gpudash` or `python -m
    gpudash`: a TUI's demo, `launch`, `serve`), or None. A server gpudash launches keeps its parent, though it
    runs in a session of its own."""
    try:
        parent = psutil.Process(pid).parent()
        words = parent.cmdline() if parent is not None else []
    except (psutil.Error, OSError):
        return None
    runs = [os.path.basename(w) for w in words[:3]]
    is_gpudash = "gpudash" in runs or any(a == "-m" and b == "gpudash" for a, b in zip(words, words[1:3]))
    return parent.pid if is_gpudash and parent is not None else None


def in_container(pid: int) -> bool:
    """Whether the process runs in another PID namespace than gpudash (docker, podman, Kubernetes)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink(f"/proc/{os.getpid()}/ns/pid")
    except OSError:
        return False


def answers(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """One GET /health: 200 means a server answers at `url`. The whole answer has one deadline, so a local
    process that drips its headers cannot hold the look for servers (or `status`) past `timeout_s`."""
    scraper = Scraper(timeout_s, timeout_s)
    try:
        return scraper.get(url, "/health")[0] == 200
    except ScrapeError:
        return False
    finally:
        scraper.close()


def server_url(words: Sequence[str]) -> str | None:
    """http://HOST:PORT of a server command line, or None when it runs no known kind or its --host/--port
    cannot be a server's address (a port that is no number from 1 to 65535, a host that is not a plain
    printable name or address)."""
    kind = kind_running(list(words))
    if kind is None:
        return None
    try:
        host, port = kind.address(words)
    except ValueError:  # int() of a digit that is not 0-9 ("²"), or of more digits than Python converts
        return None
    if not 0 < port < 65536 or not host.isascii() or not host.isprintable() or any(c in host for c in " /?#@\\"):
        return None
    url = f"http://{url_host(host)}:{port}"
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return None
    return url


def local_servers() -> dict[int, tuple[str, ...]]:
    """{pid: command line} of every process on this machine that runs a known server kind (its workers'
    command lines are not a server's, so only the server itself is listed)."""
    out = {}
    for p in psutil.process_iter(["cmdline"]):
        words = p.info.get("cmdline")
        if words and kind_running(list(words)) is not None:
            out[p.pid] = tuple(words)
    return out


def find_servers(gpu_pids: Iterable[tuple[int, int]], known: Iterable[int] = (),
                 cmdline: Mapping[int, tuple[str, ...]] | None = None, check: bool = True,
                 by_cmdline: bool = False) -> list[Found]:
    """Servers behind the GPU processes `gpu_pids` ((GPU index, pid) pairs, as NVML lists them), leaving out
    those whose pid is in `known` (servers gpudash launched or attached). `by_cmdline` adds every local
    process whose command line runs a server (on no GPU that NVML lists: the CPU, or GPUs gpudash does not
    see). A command line whose address cannot be a server's is left out. `check` asks each one's /health."""
    gpus: dict[int, set[int]] = {}
    lines: dict[int, tuple[str, ...]] = {}
    skip = set(known)
    for gpu, pid in gpu_pids:
        hit = server_process(pid, cmdline)
        if hit is None or hit[0] in skip or pid in skip:
            continue
        gpus.setdefault(hit[0], set()).add(gpu)
        lines[hit[0]] = hit[1]
    if by_cmdline:
        for pid, words in (cmdline if cmdline is not None else local_servers()).items():
            if pid not in skip and kind_running(list(words)) is not None:
                lines.setdefault(pid, words)
    out = []
    for pid, words in sorted(lines.items()):
        url = server_url(words)
        if url is None:
            continue
        kind = kind_running(list(words))
        assert kind is not None
        ok = answers(url) if check else None
        hint = None
        if ok is False:
            where = "in a container" if in_container(pid) else "here"
            hint = (f"pid {pid} runs {kind.label} {where} but does not answer at {url}; add a [[servers]] entry "
                    f"with the url its port is published at (url = \"http://HOST:PORT\")")
        out.append(Found(pid, kind.name, tuple(words), url, tuple(sorted(gpus.get(pid, ()))), ok, hint,
                         started_by_gpudash(pid)))
    return out


def found_lines(found: list[Found]) -> list[str]:
    """Found servers as lines for `gpudash status` (nothing when none were found): those another gpudash
    runs (a TUI's demo, `launch`) apart from those no gpudash started."""
    lines = []
    for heading, group in (
            ("inference servers another gpudash runs (its TUI's demo, `launch` or `serve`)",
             [f for f in found if f.gpudash_pid is not None]),
            ("inference servers gpudash did not start (attach one with a [[servers]] entry: name and url)",
             [f for f in found if f.gpudash_pid is None])):
        if not group:
            continue
        lines.append(heading)
        for f in group:
            where = f"on GPU {','.join(map(str, f.gpus))}" if f.gpus else "on no GPU gpudash sees"
            seen = {True: "answers", False: "does not answer", None: "not asked"}[f.answers]
            by = f", started by gpudash pid {f.gpudash_pid}" if f.gpudash_pid is not None else ""
            lines.append(f"  {f.name}: {f.kind} pid {f.pid} {where} at {f.url} ({seen}{by})")
            if f.hint:
                lines.append(f"    {f.hint}")
    return lines


def local_address(url: str) -> bool:
    """Whether a URL's host is this machine (a loopback address, or one of its names or addresses)."""
    host = urlsplit(url).hostname or ""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        if host == "localhost":
            return True
    mine = {socket.gethostname(), socket.getfqdn()}
    for addrs in psutil.net_if_addrs().values():
        mine.update(a.address.split("%", 1)[0] for a in addrs)
    return host in mine


def process_at(url: str) -> tuple[int, tuple[str, ...]] | None:
    """The local server process listening at `url` (its command line names that port, or its kind's
    default), or None: another host, or no matching process here."""
    if not local_address(url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    for pid, words in local_servers().items():
        at = server_url(words)
        if at is not None and urlsplit(at).port == port:
            return pid, words
    return None
