"""In-slot hits, host-cache restores and misses: which of the three served each probe request.

A llama-server slot keeps its last prompt's KV state on the GPU: a request that shares most of it is an
in-slot hit. With `--cache-ram` (on by default) a prompt pushed out of its slot is saved to host memory
and restored from there on a later prefix match; the server reports restored tokens as cached exactly
like in-slot ones, so a restore is told apart by its log line (the supervisor records each as a
`server.cache_restore` event; builds that log it at trace verbosity need `-lv 4`, see logparse.py).
What is neither is a miss: the prompt is computed anew.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpudash.records import Event, RequestSample

RESTORE_EVENT = "server.cache_restore"
KINDS = ("slot", "restore", "miss")
LABELS = {"slot": "in-slot hits", "restore": "host-cache restores", "miss": "misses"}
# A request with at least this share of its prompt cached reused a cached prompt; below it the prompt was
# computed anew (a chat template's first tokens are cached for every request).
HIT_FRACTION = 0.5
# A restore line may be read a little after its request's stream ended (the log is a pipe).
GRACE_S = 1.0
# Recorded requests of each kind (restore, miss) a server needs before their TTFTs are compared.
MIN_PER_KIND = 2
# What to change where restoring a prompt from host memory is slower than computing it anew.
SLOW_RESTORE_FIX = ('add extra_args = ["--cache-ram", "0"] to the server so evicted prompts are recomputed, or '
                    "give it more slots (`parallel`, -np) so prompts stay on the GPU; a smaller --cache-ram (MiB) "
                    "keeps only the most recent prompts")


def classify(requests: Sequence[RequestSample], events: Iterable[Event]) -> list[str | None]:
    """"slot", "restore" or "miss" per request (None for a failed one or one whose cache use is unknown).
    A restore line belongs to the last request of its server that started before it, if the line came
    before that request's end (plus GRACE_S)."""
    kinds: list[str | None] = []
    for r in requests:
        if not r.ok or r.hit_fraction is None:
            kinds.append(None)
        else:
            kinds.append("slot" if r.hit_fraction >= HIT_FRACTION else "miss")
    by_server: dict[str, list[int]] = {}
    for i in sorted(range(len(requests)), key=lambda i: requests[i].ts):
        by_server.setdefault(requests[i].server, []).append(i)
    for e in events:
        if e.kind != RESTORE_EVENT:
            continue
        started = [i for i in by_server.get(e.target, ()) if requests[i].ts <= e.ts]
        if not started:
            continue
        r = requests[started[-1]]
        end = r.ts + (r.total_s or r.ttft_s or 0.0) + GRACE_S
        if e.ts <= end and kinds[started[-1]] is not None:
            kinds[started[-1]] = "restore"
    return kinds


@dataclass(frozen=True, slots=True)
class KindStats:
    kind: str
    n: int
    median_ttft_s: float | None


def summary(requests: Sequence[RequestSample], events: Iterable[Event]) -> dict[str, KindStats]:
    """Count and median TTFT of each kind, over the requests with a TTFT."""
    ttfts: dict[str, list[float]] = {k: [] for k in KINDS}
    for r, kind in zip(requests, classify(requests, events)):
        if kind is not None and r.ttft_s is not None:
            ttfts[kind].append(r.ttft_s)
    return {k: KindStats(k, len(v), statistics.median(v) if v else None) for k, v in ttfts.items()}


@dataclass(frozen=True, slots=True)
class ServerCache:
    """One server's requests by kind, and whether its restores and misses can be compared yet."""

    server: str
    stats: dict[str, KindStats]

    @property
    def compared(self) -> bool:
        return self.stats["restore"].n >= MIN_PER_KIND and self.stats["miss"].n >= MIN_PER_KIND

    @property
    def restores_lose(self) -> bool:
        """Restoring from host memory takes longer to the first token than recomputing (median TTFTs)."""
        restore, miss = self.stats["restore"].median_ttft_s, self.stats["miss"].median_ttft_s
        return self.compared and restore is not None and miss is not None and restore > miss

    def versus_text(self) -> str:
        """'1760 ms to restore vs 1000 ms to recompute'"""
        restore, miss = self.stats["restore"].median_ttft_s or 0.0, self.stats["miss"].median_ttft_s or 0.0
        return f"{restore * 1000:.0f} ms to restore vs {miss * 1000:.0f} ms to recompute"


def by_server(requests: Sequence[RequestSample], events: Iterable[Event]) -> list[ServerCache]:
    """summary() of each server's own requests and restore events, by server name."""
    events = list(events)
    return [ServerCache(server, summary([r for r in requests if r.server == server],
                                        [e for e in events if e.target == server]))
            for server in sorted({r.server for r in requests})]


def summary_text(stats: dict[str, KindStats]) -> str:
    """'in-slot hits: 3, median TTFT 22 ms | host-cache restores: ...' for the Latency view."""
    parts = []
    for k in KINDS:
        s = stats[k]
        ttft = "—" if s.median_ttft_s is None else f"{s.median_ttft_s * 1000:.0f} ms"
        parts.append(f"{LABELS[k]}: {s.n}, median TTFT {ttft}")
    return " | ".join(parts)
