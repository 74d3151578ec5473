"""Reading a stats block and writing a knob block across a real process boundary: process_side.c
creates both segments with shm_open and plays the preloaded process's side of the sequence lock."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gpudash.preload import shm as P
from gpudash.engine.errors import EngineArgumentError

FULL = {"h2d_chunk_bytes": 4_000_000, "d2h_chunk_bytes": 5_370_000, "h2d_fallback_bytes": 11_300_000,
        "d2h_fallback_bytes": 13_000_000, "outstanding": 3, "direct_first": False, "staging_threads": 12,
        "h2d_staging_bytes": 8 << 20, "d2h_staging_bytes": 2 << 20}


def _until(predicate, what: str, timeout_s: float = 30.0):
    """Wait for the other process (it polls every 10 ms); the limit only turns a hang into a failure."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    pytest.fail(f"{what} did not happen within {timeout_s} s")


def test_stats_written_in_c_read_in_python(process_side) -> None:
    ps = process_side("llama-a")
    assert ps.cmd("copy h2d 1000000000 400000000 500000000") == "ok"
    assert ps.cmd("copy h2d 500000000 100000000 200000000") == "ok"
    assert ps.cmd("copy d2h 2000000 1000 2000") == "ok"
    assert ps.cmd("pass d2h 4096") == "ok"
    with P.StatsView(ps.pid) as view:
        s = view.read()
    assert (s.pid, s.name, s.state) == (ps.pid, "llama-a", "active")
    assert (s.h2d.copies_taken, s.h2d.bytes_taken, s.h2d.ns_in_calls_taken, s.h2d.ns_to_landed_taken) == (
        2, 1_500_000_000, 500_000_000, 700_000_000)
    assert (s.d2h.copies_taken, s.d2h.copies_passed, s.d2h.bytes_passed) == (1, 1, 4096)
    assert [(p.name, p.direction, p.bytes, p.chunks) for p in s.paths] == [
        ("direct:0", "h2d", 1_500_000_000, 2), ("direct:0", "d2h", 2_000_000, 1)]
    assert [(l.gpu, l.h2d_bytes, l.d2h_bytes) for l in s.links] == [(0, 1_500_000_000, 2_000_000)]
    assert s.knobs["h2d_chunk_bytes"] == 2_810_000 and s.knobs["direct_first"] is True
    assert s.knobs_generation == 0


def test_reads_are_never_torn_while_the_process_publishes(process_side) -> None:
    """Every read sees all the counters of both directions equal although the process rewrites them as fast as it can."""
    ps = process_side()
    seen: set[int] = set()
    with P.StatsView(ps.pid) as view:
        for _ in range(20):  # until the reads did overlap the publishing (a busy machine may delay them)
            done = threading.Event()
            writer = threading.Thread(target=lambda: (ps.cmd("spin 300000"), done.set()))
            writer.start()
            while not done.is_set():
                raw = view.read_raw()
                values = set(memoryview(bytes(raw.dir)).cast("Q"))  # every word of both directions
                assert len(values) == 1, f"a torn read: {sorted(values)}"
                seen |= values
            writer.join()
            if len(seen - {0, 300_000}) > 0:
                break
        assert view.read().h2d.errors == 300_000
    assert seen - {0, 300_000}, "no read overlapped the publishing"


def test_knobs_written_in_python_applied_in_c(process_side) -> None:
    ps = process_side()
    with P.KnobBlock(ps.pid) as kb:
        gen = kb.write(FULL)
        assert gen == 1 and kb.read().generation == 1
    assert _until(lambda: P.outcome(ps.pid, gen) == "applied", "applying generation 1")
    assert ps.cmd("knobs") == ("generation 1 h2d_chunk_bytes 4000000 staging_threads 12 direct_first 0 "
                               "h2d_staging_bytes 8388608 enabled 1")
    with P.StatsView(ps.pid) as view:
        s = view.read()
    assert s.knobs_generation == 1 and s.knobs == FULL


def test_a_refusal_is_seen_as_rejected_generation(process_side) -> None:
    ps = process_side()
    assert ps.cmd("refuse 1") == "ok"
    with P.KnobBlock(ps.pid) as kb:
        gen = kb.write({**FULL, "outstanding": 5})
        assert _until(lambda: P.outcome(ps.pid, gen) == "rejected", "refusing generation 1")
        assert kb.read().rejected_generation == gen
    with P.StatsView(ps.pid) as view:
        assert view.read().knobs["outstanding"] == 2  # the old knobs stay in force


def test_a_bad_knob_block_is_refused_before_anything_is_written(process_side) -> None:
    ps = process_side()
    with P.KnobBlock(ps.pid) as kb:
        with pytest.raises(EngineArgumentError, match="staging_threads=0 is out of range"):
            kb.write({**FULL, "staging_threads": 0})
        with pytest.raises(EngineArgumentError, match="missing: d2h_staging_bytes"):
            kb.write({k: v for k, v in FULL.items() if k != "d2h_staging_bytes"})
        assert kb.read().generation == 0
    assert ps.cmd("knobs").startswith("generation 0 h2d_chunk_bytes 2810000 ")


def test_a_writer_stuck_mid_write_ends_in_an_error_not_a_hang(process_side) -> None:
    ps = process_side()
    assert ps.cmd("hold") == "ok"
    with P.StatsView(ps.pid) as view, pytest.raises(P.BlockUnavailable, match="stayed mid-write"):
        view.read()


def test_the_last_values_stay_readable_after_the_process_exits(process_side) -> None:
    ps = process_side()
    view = P.StatsView(ps.pid)
    assert ps.cmd("copy d2h 777 1 2") == "ok"
    assert ps.end("quit") == 0
    assert not (P.SHM_DIR / f"{P.STATS_PREFIX}{ps.pid}").exists()
    assert view.read().d2h.bytes_taken == 777
    view.close()


def test_discovery_lists_live_processes_only(process_side) -> None:
    live, dead = process_side(), process_side()
    assert dead.end("exit") == 3  # leaves its blocks behind, like a crash
    assert (P.SHM_DIR / f"{P.STATS_PREFIX}{dead.pid}").exists()
    pids = P.preload_pids()
    assert live.pid in pids and dead.pid not in pids


def test_a_block_of_another_layout_is_named(tmp_path: Path) -> None:
    (tmp_path / f"{P.STATS_PREFIX}{os.getpid()}").write_bytes(b"\0" * 8)
    with pytest.raises(P.BlockUnavailable, match="holds 8 bytes"):
        P.StatsView(os.getpid(), tmp_path)
    (tmp_path / f"{P.KNOBS_PREFIX}{os.getpid()}").write_bytes(b"\1" * 200)
    with pytest.raises(P.BlockUnavailable, match="magic 0x1010101 version 16843009"):
        P.KnobBlock(os.getpid(), tmp_path)
    with pytest.raises(P.BlockUnavailable, match="cannot open"):
        P.StatsView(1, tmp_path)


def test_read_after_waits_for_a_publish_newer_than_the_copies(process_side) -> None:
    """A process publishes every ~100 ms; a reader that just made copies wants a publish made after them."""
    ps = process_side()
    t = time.time()
    assert ps.cmd(f"at {t - 1}") == "ok"  # the latest publish predates t
    later = threading.Timer(0.2, lambda: ps.cmd(f"at {t + 0.5}"))
    later.start()
    with P.StatsView(ps.pid) as view:
        assert view.read().updated_at == pytest.approx(t - 1)
        s = view.read_after(t)
        assert s.updated_at == pytest.approx(t + 0.5) and time.time() - t >= 0.2
        assert ps.cmd(f"at {t - 1}") == "ok"
        assert view.read_after(time.time(), timeout_s=0.1).updated_at == pytest.approx(t - 1)  # none came: the latest
    later.join()
