"""The telemetry source "servers": each server's process state plus what its kind reads from it each tick.

How a kind's /metrics become ServerSample fields lives in its module (kinds/); the shared counter and
rate arithmetic in counters.py. A kind's rates need the previous scrape of the same server process, so
`ServerSource` keeps it, and must be the only scraper (llama-server resets some gauges on every read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gpudash.launcher.counters import History, Prev
from gpudash.launcher.discovery import Found, find_servers
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.scrape_http import Scraper, ScrapeError
from gpudash.records import ServerSample, ServerState

if TYPE_CHECKING:
    from gpudash.launcher.supervisor import Supervisor

SCRAPE_TIMEOUT_S = 0.3  # per read
SCRAPE_DEADLINE_S = 0.6  # per whole answer: a tick scrapes twice (/metrics, /slots) within its second
SCRAPE_WORKERS = 8
FIND_EVERY_S = 10.0  # how often the GPUs' processes are looked through for servers gpudash does not know


class ServerSource:
    """Telemetry source: the supervisor's process states plus each ready server's scraped /metrics, and
    each attached server's last background read (launcher/attach.py).

    A server whose scrape fails this tick keeps its process state and has NA metrics; the error text
    goes into the snapshot's `errors`.
    """

    name = "servers"

    def __init__(self, supervisor: Supervisor, timeout_s: float = SCRAPE_TIMEOUT_S,
                 gpu_pids: Callable[[], list[tuple[int, int]]] | None = None):
        """`gpu_pids` lists the real GPUs' processes (NVML; none on a simulated rig): servers among them, and
        every local process whose command line runs a server, that gpudash neither runs nor reads show as
        "found" rows, looked for in the background every FIND_EVERY_S. None: no look at all."""
        self._sup = supervisor
        self._gpu_pids = gpu_pids
        self._found: list[Found] = []
        self._finding: Future | None = None
        self._found_at = -FIND_EVERY_S
        self._http = Scraper(timeout_s, SCRAPE_DEADLINE_S)
        self._history: dict[str, History] = {}
        # Servers are scraped in parallel, so one slow server does not push the others past the tick.
        self._pool = ThreadPoolExecutor(max_workers=SCRAPE_WORKERS, thread_name_prefix="gpudash-scrape")
        # The look for servers has its own thread: it asks each process it finds for /health in turn (0.5 s
        # each at worst), which on the scrape pool would hold a worker that this tick's scrapes wait for.
        self._finder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpudash-find")

    def poll(self) -> dict[str, tuple]:
        states = self._sup.states()
        attached, errors = self._sup.attached.poll(self._http, self._pool)  # never waits on an attached one
        latest = {s.server: s for s in attached}
        scrapes = {st.server: self._pool.submit(self._scrape, st) for st in states
                   if st.server not in latest and st.state.up}
        found = self._found_now({s.server for s in states}, {s.pid for s in (*states, *attached) if s.pid is not None})
        health = [self._pool.submit(self._answers, f.url) for f in found]
        out = []
        failed = list(errors)
        for st in states:
            if st.server in latest:
                out.append(latest[st.server])
            elif st.server not in scrapes:
                out.append(st)
            else:
                try:
                    out.append(scrapes[st.server].result())
                except (ScrapeError, ValueError) as err:
                    failed.append(f"{st.server}: /metrics scrape failed: {err}")
                    out.append(st)
        ts = time.time()
        out += [ServerSample(ts=ts, server=f.name, kind=f.kind, state=ServerState.FOUND, pid=f.pid,
                             port=urlsplit(f.url).port, origin="found", error=f.hint, url=f.url,
                             answers=answered.result())
                for f, answered in zip(found, health)]
        result: dict[str, tuple] = {"servers": tuple(out)}
        if failed:
            result["errors"] = tuple(failed)
        return result

    def _answers(self, url: str) -> bool:
        """This tick's GET /health of a found server: 200 is up (what `gpudash_server_up` exports for it)."""
        try:
            return self._http.get(url, "/health")[0] == 200
        except ScrapeError:
            return False

    def _found_now(self, names: set[str], pids: set[int]) -> list[Found]:
        """The servers found on the GPUs at the last look (started anew when due, never waited for), less
        those gpudash runs or reads."""
        if self._gpu_pids is None:
            return []
        now = time.monotonic()
        if (self._finding is None or self._finding.done()) and now - self._found_at >= FIND_EVERY_S:
            self._found_at = now
            known = set(self._sup.pids())
            self._finding = self._finder.submit(self._find, known)
        return [f for f in self._found if f.name not in names and f.pid not in pids]

    def _find(self, known: set[int]) -> None:
        assert self._gpu_pids is not None
        self._found = find_servers(self._gpu_pids(), known=known, by_cmdline=True)

    def _scrape(self, st: ServerSample) -> ServerSample:
        base = self._sup.base_url(st.server)
        if base is None:
            raise ScrapeError("it has no port yet")
        spec = self._sup.specs().get(st.server)
        if spec is None:
            raise ScrapeError("it is no longer configured")
        now = time.time()
        auth = self._sup.auth(st.server)  # a server started with --api-key guards /metrics with it
        history = self._history.setdefault(st.server, History())
        fields, values = kind_of(spec).scrape(lambda path: self._http.get(base, path, auth), spec, history,
                                              st.pid, now)
        history.add(Prev(st.pid, now, values))
        # Metrics win over the log's last line; the log still fills what a server does not export.
        merged = {k: v for k, v in fields.items() if v is not None}
        return replace(st, ts=now, **merged)

    def close(self) -> None:
        """Stop reading: reads in flight end now (their sockets are shut), none is waited out."""
        self._http.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._finder.shutdown(wait=True, cancel_futures=True)
