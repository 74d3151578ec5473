"""One recorded session in a few lines: TTFT (median/p90) and prefix-cache hits per server, each server's
VRAM per process, PCIe per GPU and the GPUs' memory, read from the SQLite file that `serve`/`record`
wrote. TTFT and hits are `gpudash probe`'s own summary (a hit: a request whose prompt came mostly from
the cache). benchmarks/gpu_box.sh prints it after each headless run.

    python3 benchmarks/session_summary.py DB [SESSION]   (default: the newest session)
"""

from __future__ import annotations

import sqlite3
import sys

from gpudash.launcher.probe.correlation import summarize
from gpudash.store import Store, codec


def summary(db_path: str, session: int | None = None) -> str:
    db = sqlite3.connect(db_path)
    if session is None:
        (session,) = db.execute("select max(id) from sessions").fetchone()
    started, ended, source = db.execute("select started, ended, source from sessions where id = ?",
                                         (session,)).fetchone()
    out = [f"session {session} [{source}], {((ended or started) - started):.0f} s recorded"]
    with Store.open(db_path, writing=False) as store:  # the probe's requests, decoded as the app reads them
        reqs = [codec.decode("requests", r) for r in store.rows(session, "requests")]
    for server in sorted({r.server for r in reqs}):
        s = summarize([r for r in reqs if r.server == server])
        line = f"  {server}: {s.requests - s.failed}/{s.requests} requests ok"
        if s.ttft_median_ms is not None:
            cached = sum(r.cached_tokens or 0 for r in reqs if r.server == server and r.ok)
            prompt = sum(r.prompt_tokens or 0 for r in reqs if r.server == server and r.ok)
            line += (f", TTFT median {s.ttft_median_ms:.1f} ms, p90 {s.ttft_p90_ms:.1f} ms; {s.hits} prefix hits and "
                     f"{s.misses} misses, {cached}/{prompt} prompt tokens from the cache")
            if s.hit_ttft_median_ms is not None and s.miss_ttft_median_ms is not None:
                line += (f"; TTFT median with a hit {s.hit_ttft_median_ms:.1f} ms vs without "
                         f"{s.miss_ttft_median_ms:.1f} ms")
        out.append(line)
    for server, gpu, pid, name, peak in db.execute(
            "select server, gpu_index, pid, name, max(used_bytes) from gpu_process_samples where session_id = ? "
            "group by server, gpu_index, pid order by gpu_index, pid", (session,)):
        out.append(f"  GPU {gpu} pid {pid} ({name or '?'}, server {server or '-'}): peak {(peak or 0) / 2**20:.0f} MiB")
    for gpu, name, tx_max, rx_max, tx_mean, rx_mean, used, total, gen, width in db.execute(
            "select \"index\", name, max(pcie_tx_bps), max(pcie_rx_bps), avg(pcie_tx_bps), avg(pcie_rx_bps), "
            "max(mem_used), max(mem_total), max(link_gen), max(link_width) from gpu_samples where session_id = ? "
            "group by \"index\"", (session,)):
        def gbps(v: float | None) -> str:
            return "n/a" if v is None else f"{v / 1e9:.2f}"
        out.append(f"  GPU {gpu} {name}: PCIe gen{gen} x{width}, TX max {gbps(tx_max)} GB/s (mean {gbps(tx_mean)}), "
                   f"RX max {gbps(rx_max)} GB/s (mean {gbps(rx_mean)}); memory used max "
                   f"{(used or 0) / 2**30:.1f} of {(total or 0) / 2**30:.1f} GiB")
    events = db.execute("select kind, target, new, ok from events where session_id = ? order by ts",
                        (session,)).fetchall()
    out.append("  events: " + ", ".join(f"{k} {t}{'' if ok else ' (refused)'}" for k, t, _n, ok in events))
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
