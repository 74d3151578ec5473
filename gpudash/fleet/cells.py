"""A fleet's boxes and servers as text cells, the same in `gpudash fleet`'s tables and the TUI's Fleet tab."""

from __future__ import annotations

from gpudash import fmt
from gpudash.fleet.boxes import DOWN, STALE, FleetBox, FleetServer


def box_cells(b: FleetBox, now: float) -> dict[str, str]:
    """A box's row as text, column -> cell (the CLI table and the Fleet tab share it)."""
    if b.status in (DOWN, STALE):
        state = f"{b.status}, last seen {fmt.duration(now - b.last_seen)} ago" if b.last_seen else b.status
    else:
        state = b.status
    link = f" / {fmt.rate(b.link_bps)}" if b.link_bps else ""
    ready = sum(s.state == "ready" for s in b.servers)
    return {
        "box": b.instance, "host": b.hostname or fmt.NA, "rig": b.rig or fmt.NA, "state": state,
        "GPUs": fmt.num(b.gpus, "d"), "util": fmt.pct(b.util),
        "VRAM": f"{fmt.size(b.mem_used)} / {fmt.size(b.mem_total)}" if b.mem_total else fmt.NA,
        "PCIe TX": fmt.rate(b.tx_bps) + link if b.tx_bps is not None else fmt.NA,
        "RX": fmt.rate(b.rx_bps) + link if b.rx_bps is not None else fmt.NA,
        "servers": f"{len(b.servers)} ({ready} ready)" if b.servers else fmt.NA,
        "alerts": ", ".join(b.alerts) or fmt.NA,
    }


def server_cells(b: FleetBox, s: FleetServer) -> dict[str, str]:
    """One server's row: TTFT p90 from gpudash's probe requests, else the server's own mean (said so)."""
    ttft = fmt.num(s.ttft_p90_s, ".2f", " s") if s.ttft_p90_s is not None else fmt.num(s.ttft_mean_s, ".2f", " s mean")
    return {"box": b.instance, "server": s.server, "kind": s.kind, "state": s.state, "TTFT p90": ttft,
            "hit rate": fmt.pct(s.hit_rate), "KV": fmt.pct(s.kv_usage), "tok/s": fmt.num(s.tokens_per_s, ".1f")}


COLUMNS = ("box", "host", "rig", "state", "GPUs", "util", "VRAM", "PCIe TX", "RX", "servers", "alerts")
SERVER_COLUMNS = ("box", "server", "kind", "state", "TTFT p90", "hit rate", "KV", "tok/s")
RIGHT = {"GPUs", "util", "TTFT p90", "hit rate", "KV", "tok/s"}
