"""A fleet's boxes and servers as text cells, the same in `gpudash fleet`'s tables and the TUI's Fleet tab.

Every label read from Prometheus (a host name, an instance, a server, its state, an alert's name) is text
from outside: it goes through gpudash/outside.py's `printable`, so no escape sequence reaches a terminal.
(A renderer that reads Rich markup escapes the cells as well: the CLI's tables do.)
"""

from __future__ import annotations

from gpudash import fmt
from gpudash.fleet.boxes import DOWN, PARTLY, STALE, FleetBox, FleetServer
from gpudash.outside import printable

# What a box's targets export, as the "from" column says it.
_SHORT = {"gpudash": "gpudash", "dcgm-exporter": "dcgm", "vllm": "vllm", "llama.cpp": "llama"}


def box_cells(b: FleetBox, now: float | None = None) -> dict[str, str]:
    """A box's row as text, column -> cell (the CLI table and the Fleet tab share it). A box down or stale
    says when it was last seen: how long ago (at `now`), or, without `now`, the time itself, which stays
    the same from one refresh to the next (the Fleet tab redraws only rows that changed)."""
    state = b.status
    if b.status in (DOWN, STALE) and b.last_seen:
        when = f"{fmt.duration(now - b.last_seen)} ago" if now is not None else fmt.clock(b.last_seen)
        state = f"{b.status}, last seen {when}"
    elif b.status == PARTLY:
        state = f"{b.status}: {', '.join(t.instance for t in b.targets if not t.up)}"
    tx, rx, link = b.tx_bps, b.rx_bps, b.link_bps
    if tx is None and rx is None:
        pcie = fmt.NA
    else:  # GB/s one way each, against what the links carry one way
        pcie = f"{fmt.num(None if tx is None else tx / 1e9, '.2f')} / " \
               f"{fmt.num(None if rx is None else rx / 1e9, '.2f')}{f' of {link / 1e9:.1f}' if link else ''} GB/s"
    used, total = b.mem_used, b.mem_total
    ready = sum(s.state == "ready" for s in b.servers)
    return {
        "box": printable(b.box), "host": printable(b.hostname or fmt.NA), "rig": printable(b.rig or fmt.NA),
        "state": printable(state), "GPUs": fmt.num(b.gpu_count, "d"), "util": fmt.pct(b.util),
        "VRAM": f"{fmt.size(used)} / {fmt.size(total)}" if total else fmt.NA,
        "PCIe TX / RX": pcie,
        "servers": f"{len(b.servers)} ({ready} ready)" if b.servers else fmt.NA,
        "alerts": printable(", ".join(b.alerts)) or fmt.NA,
        "J/token": fmt.num(b.joules_per_token, ".3g", " J"),  # fleet/energy.py: its GPUs' energy / its tokens
        "from": "+".join(_SHORT.get(e, printable(e)) for e in b.exports) or fmt.NA,
    }


def server_cells(b: FleetBox, s: FleetServer) -> dict[str, str]:
    """One server's row: TTFT p90 of every request it served (its own histogram), else of gpudash's probe
    requests (said so); the same for the prefix-cache hit rate."""
    if s.ttft_p90_s is not None:
        ttft = fmt.num(s.ttft_p90_s, ".2f", " s")
    else:
        ttft = fmt.num(s.probe_ttft_p90_s, ".2f", " s probe")
    hits = fmt.pct(s.hit_rate) if s.hit_rate is not None else (
        f"{fmt.pct(s.probe_hit_rate)} probe" if s.probe_hit_rate is not None else fmt.NA)
    return {"box": printable(b.box), "server": printable(s.server), "kind": printable(s.kind),
            "state": printable(s.state), "TTFT p90": ttft, "hit rate": hits, "KV": fmt.pct(s.kv_usage),
            "tok/s": fmt.num(s.tokens_per_s, ".1f"), "queue": fmt.num(s.waiting, ".0f")}


COLUMNS = ("box", "host", "rig", "state", "GPUs", "util", "VRAM", "PCIe TX / RX", "servers", "alerts", "J/token",
           "from")
SERVER_COLUMNS = ("box", "server", "kind", "state", "TTFT p90", "hit rate", "KV", "tok/s", "queue")
RIGHT = {"GPUs", "util", "TTFT p90", "hit rate", "KV", "tok/s", "queue"}
