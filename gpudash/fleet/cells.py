"""A fleet's boxes and servers as text cells, the same in `gpudash fleet`'s tables and the TUI's Fleet tab."""

from __future__ import annotations

from gpudash import fmt
from gpudash.fleet.boxes import DOWN, STALE, FleetBox, FleetServer


def box_cells(b: FleetBox, now: float | None = None) -> dict[str, str]:
    """A box's row as text, column -> cell (the CLI table and the Fleet tab share it). A box down or stale
    says when it was last seen: how long ago (at `now`), or, without `now`, the time itself, which stays
    the same from one refresh to the next (the Fleet tab redraws only rows that changed)."""
    if b.status in (DOWN, STALE) and b.last_seen:
        when = f"{fmt.duration(now - b.last_seen)} ago" if now is not None else fmt.clock(b.last_seen)
        state = f"{b.status}, last seen {when}"
    else:
        state = b.status
    if b.tx_bps is None and b.rx_bps is None:
        pcie = fmt.NA
    else:  # GB/s one way each, against what the links carry one way
        link = f" of {b.link_bps / 1e9:.1f}" if b.link_bps else ""
        pcie = f"{fmt.num(None if b.tx_bps is None else b.tx_bps / 1e9, '.2f')} / " \
               f"{fmt.num(None if b.rx_bps is None else b.rx_bps / 1e9, '.2f')}{link} GB/s"
    ready = sum(s.state == "ready" for s in b.servers)
    return {
        "box": b.instance, "host": b.hostname or fmt.NA, "rig": b.rig or fmt.NA, "state": state,
        "GPUs": fmt.num(b.gpus, "d"), "util": fmt.pct(b.util),
        "VRAM": f"{fmt.size(b.mem_used)} / {fmt.size(b.mem_total)}" if b.mem_total else fmt.NA,
        "PCIe TX / RX": pcie,
        "servers": f"{len(b.servers)} ({ready} ready)" if b.servers else fmt.NA,
        "alerts": ", ".join(b.alerts) or fmt.NA,
    }


def server_cells(b: FleetBox, s: FleetServer) -> dict[str, str]:
    """One server's row: TTFT p90 from gpudash's probe requests, else the server's own mean (said so)."""
    ttft = fmt.num(s.ttft_p90_s, ".2f", " s") if s.ttft_p90_s is not None else fmt.num(s.ttft_mean_s, ".2f", " s mean")
    return {"box": b.instance, "server": s.server, "kind": s.kind, "state": s.state, "TTFT p90": ttft,
            "hit rate": fmt.pct(s.hit_rate), "KV": fmt.pct(s.kv_usage), "tok/s": fmt.num(s.tokens_per_s, ".1f")}


COLUMNS = ("box", "host", "rig", "state", "GPUs", "util", "VRAM", "PCIe TX / RX", "servers", "alerts")
SERVER_COLUMNS = ("box", "server", "kind", "state", "TTFT p90", "hit rate", "KV", "tok/s")
RIGHT = {"GPUs", "util", "TTFT p90", "hit rate", "KV", "tok/s"}
