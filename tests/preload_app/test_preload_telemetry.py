"""PreloadSource turns preloaded processes' stats blocks into engine_paths samples tagged with the
server's name, with rates from counter deltas; the store keeps the tag (old files gain the column)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.preload.shm import StatsView
from gpudash.records import Snapshot
from gpudash.store import Store, StoreWriter
from gpudash.preload.source import PreloadSource


def _rows(source: PreloadSource, server: str) -> dict[tuple[str, str], object]:
    return {(r.path, r.direction): r for r in source.poll()["engine_paths"] if r.server == server}


def test_rates_come_from_counter_deltas_between_publishes(process_side) -> None:
    ps = process_side("llama-a")
    src = PreloadSource()
    assert ps.cmd("copy h2d 2000000000 1 1") == "ok" and ps.cmd("at 1000.0") == "ok"
    first = _rows(src, "llama-a")
    assert set(first) == {("direct:0", "h2d"), ("direct:0", "d2h")}
    h2d = first[("direct:0", "h2d")]
    assert (h2d.bytes_total, h2d.chunks_total, h2d.gpu, h2d.via, h2d.gbps) == (2_000_000_000, 1, 0, None, 0.0)
    for line in ("copy h2d 3000000000 1 1", "copy d2h 500000000 1 1", "at 1002.0"):
        assert ps.cmd(line) == "ok"
    second = _rows(src, "llama-a")
    assert second[("direct:0", "h2d")].gbps == pytest.approx(1.5)  # 3 GB over 2 s
    assert second[("direct:0", "d2h")].gbps == pytest.approx(0.25)
    third = _rows(src, "llama-a")  # nothing published since: no new bytes known
    assert third[("direct:0", "h2d")].gbps == 0.0 and third[("direct:0", "h2d")].bytes_total == 5_000_000_000


def test_a_paths_cpu_is_its_directions_whole_cost_so_core_seconds_per_gb_show(process_side) -> None:
    """The callers' CPU inside taken copies and gpudash's own threads' CPU reach the path rows (the Engine
    view, gpudash_engine_path_cpu_seconds) and `gpudash run --stats`' CPU s/GB column."""
    ps = process_side("llama-cpu")
    for line in ("copy h2d 2000000000 1 1", "cpu h2d 300000000 500000000", "at 1000.0"):
        assert ps.cmd(line) == "ok"
    rows = _rows(PreloadSource(), "llama-cpu")
    # no path accounted CPU of its own: gpudash's threads are shared by bytes, all of them H2D here
    assert rows[("direct:0", "h2d")].cpu_s == pytest.approx(0.8)
    assert rows[("direct:0", "d2h")].cpu_s == 0.0
    with StatsView(ps.pid) as view:
        lines = view.read().summary_lines()
    assert lines[0].split()[-2:] == ["CPU", "s/GB"]
    assert lines[1].split()[-1] == "0.400" and lines[2].split()[-1] == "—"  # 0.8 core-s over 2 GB; no D2H
    assert "gpudash's own threads used 0.500 core-s" in lines[-1]


def test_the_supervisors_name_wins_and_gone_processes_vanish(process_side) -> None:
    ps = process_side("block-name")
    src = PreloadSource(pids=lambda: {ps.pid: "big"})
    assert _rows(src, "big") and not _rows(src, "block-name")
    assert ps.end("quit") == 0
    assert not _rows(src, "big")


def test_a_servers_processes_are_summed_per_path(process_side) -> None:
    api, worker = process_side("v"), process_side("v")
    assert api.cmd("copy h2d 100 1 1") == "ok" and worker.cmd("copy h2d 300 1 1") == "ok"
    rows = _rows(PreloadSource(), "v")
    assert (rows[("direct:0", "h2d")].bytes_total, rows[("direct:0", "h2d")].chunks_total) == (400, 2)
    assert len(rows) == 2


def test_an_unreadable_block_is_an_error_of_the_tick_not_an_exception(process_side) -> None:
    ps = process_side("stuck")
    assert ps.cmd("hold") == "ok"
    polled = PreloadSource(pids=lambda: {ps.pid: "stuck"}).poll()
    assert not [r for r in polled["engine_paths"] if r.server == "stuck"]
    assert any(e.startswith(f"preload: stuck (pid {ps.pid}): ") and "mid-write" in e for e in polled["errors"])


def test_tagged_rows_round_trip_through_the_store(process_side, tmp_path: Path) -> None:
    ps = process_side("llama-a")
    assert ps.cmd("copy h2d 1000 1 1") == "ok"
    rows = tuple(r for r in PreloadSource().poll()["engine_paths"] if r.server == "llama-a")
    store = Store.open(tmp_path / "g.db")
    sid = store.begin_session("nvml", Config())
    writer = StoreWriter(store.path, sid, flush_interval_s=0.05)
    writer.submit(Snapshot(ts=rows[0].ts, tick=0, source="nvml", engine_paths=rows))
    writer.close()
    got = {(r["server"], r["path"], r["direction"], r["bytes_total"]) for r in store.rows(sid, "engine_path_samples")}
    store.close()
    assert got == {("llama-a", "direct:0", "h2d", 1000), ("llama-a", "direct:0", "d2h", 0)}


def test_a_file_from_before_the_server_column_gains_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = Store.open(path)
    sid = store.begin_session("nvml", Config())
    store.close()
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE engine_path_samples DROP COLUMN server")
    con.execute("INSERT INTO engine_path_samples (session_id, tick, ts, path, gpu, direction, bytes_total, "
                "chunks_total, queue_depth, gbps, cpu_s) VALUES (?, 0, 1.0, 'direct:0', 0, 'h2d', 5, 1, 0, 1.0, 0.1)",
                [sid])
    con.commit()
    con.close()
    store = Store.open(path)
    cols = [r[1] for r in store.db.execute("PRAGMA table_info(engine_path_samples)").fetchall()]
    (server,) = store.db.execute("SELECT server FROM engine_path_samples").fetchone()
    store.close()
    assert "server" in cols and server is None


def test_a_sim_session_reads_no_preloaded_process() -> None:
    from gpudash.telemetry.factory import build_sources

    sources = build_sources("sim:h200", Config())
    try:
        assert "preload" not in [s.name for s in sources]
    finally:
        for s in sources:
            s.close()
