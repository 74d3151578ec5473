"""`gpudash record` as a real process on a sim rig: row counts, SIGTERM, kill -9, Prometheus, bad input."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli_helpers import query, run, start
from gpudash.launcher.health import free_port


def _wait_for(pred, timeout: float = 30.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise AssertionError("condition not met in time")


def _ticks(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        return query(db, "SELECT count(*) FROM ticks")[0][0]
    except Exception:  # schema not created yet
        return 0


def test_record_8xh20_for_3s_writes_one_row_per_gpu_per_tick(tmp_path: Path) -> None:
    db = tmp_path / "rec.db"
    proc = run(tmp_path, "record", "--sim", "8xh20", "--duration", "3", "--interval", "0.5", "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    closed = proc.stderr.strip().splitlines()[-1]  # durations read as everywhere else (gpudash.fmt): 0m03s
    assert re.fullmatch(r"gpudash record: session 1 closed: \d+ ticks, \d+ rows in \d+m\d\ds", closed), closed
    per_gpu = dict(query(db, "SELECT [index], count(*) FROM gpu_samples GROUP BY [index]"))
    assert sorted(per_gpu) == list(range(8))
    expected = 3 / 0.5
    assert all(abs(n - expected) <= 1 for n in per_gpu.values()), per_gpu
    assert len(set(per_gpu.values())) == 1  # every tick has every GPU
    (source, ended, started, config), = query(db, "SELECT source, ended, started, config FROM sessions")
    assert source == "sim:8xh20" and ended is not None and 2.5 < ended - started < 10
    assert "[engine]" in config
    assert query(db, "SELECT count(DISTINCT tick) FROM host_samples")[0][0] == per_gpu[0]
    hist = run(tmp_path, "history", "--db", str(db), "--json")
    assert hist.returncode == 0, hist.stderr
    (info,) = json.loads(hist.stdout)["sessions"]
    assert info["source"] == "sim:8xh20" and info["rows"]["gpu_samples"] == sum(per_gpu.values())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_or_ctrl_c_flushes_and_closes_the_session(tmp_path: Path, sig: signal.Signals) -> None:
    db = tmp_path / "term.db"
    proc = start(tmp_path, "record", "--sim", "8xh20", "--interval", "0.1", "--db", str(db), "--quiet")
    try:
        seen = _wait_for(lambda: _ticks(db) >= 3 and _ticks(db))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    (ended,), = query(db, "SELECT ended FROM sessions")
    assert ended is not None
    ticks = _ticks(db)
    assert ticks >= seen
    assert query(db, "SELECT count(*) FROM gpu_samples")[0][0] == 8 * ticks  # the last ticks were flushed too


def test_kill_9_leaves_an_intact_db_with_every_flushed_tick(tmp_path: Path) -> None:
    db = tmp_path / "kill.db"
    cfg = tmp_path / "fast.toml"
    cfg.write_text("[store]\nflush_interval_s = 0.2\n")
    proc = start(tmp_path, "--config", str(cfg), "record", "--sim", "8xh20", "--interval", "0.05", "--db", str(db),
                 "--quiet")
    try:
        seen = _wait_for(lambda: _ticks(db) >= 10 and _ticks(db))
        time.sleep(0.3)  # kill it mid-run, between or during flushes
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert query(db, "PRAGMA integrity_check") == [("ok",)]
    ticks = [t for (t,) in query(db, "SELECT tick FROM ticks ORDER BY tick")]
    assert len(ticks) >= seen and ticks == list(range(len(ticks)))  # every flushed tick, no gaps
    per_tick = set(query(db, "SELECT count(*) FROM gpu_samples GROUP BY tick"))
    assert per_tick == {(8,)}  # flushes are atomic: no half-written tick
    assert query(db, "SELECT count(DISTINCT tick) FROM gpu_samples")[0][0] == len(ticks)
    (ended,), = query(db, "SELECT ended FROM sessions")
    assert ended is None  # it never got the chance to close


def test_prometheus_serves_live_labelled_values(tmp_path: Path) -> None:
    port = free_port()
    proc = start(tmp_path, "record", "--sim", "8xh20", "--interval", "0.2", "--db", str(tmp_path / "p.db"),
                 "--prometheus", str(port), "--quiet", "--duration", "20")
    try:
        def scrape():
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.TransportError:
                return None
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            return fams if "gpudash_gpu_utilization_ratio" in fams else None

        fams = _wait_for(scrape)
        util = fams["gpudash_gpu_utilization_ratio"].samples
        assert sorted(int(s.labels["gpu"]) for s in util) == list(range(8))
        assert {s.labels["source"] for s in util} == {"sim:8xh20"}
        assert all(0 <= s.value <= 1 for s in util)
        (info,) = fams["gpudash_box_info"].samples
        assert info.labels["rig"] == "sim:8xh20" and info.labels["driver"] == "none"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0


def test_bad_prometheus_address_and_taken_port_are_usage_errors(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    proc = run(tmp_path, "record", "--sim", "h200", "--duration", "1", "--db", str(db), "--prometheus", "localhost:")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gpudash: --prometheus expects [HOST:]PORT with a port from 1 to 65535 (e.g. 9401 or 0.0.0.0:9401), "
        "got 'localhost:'"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run(tmp_path, "record", "--sim", "h200", "--duration", "1", "--db", str(db), "--prometheus", str(port))
    assert proc.returncode == 2
    assert "pick another [HOST:]PORT for --prometheus" in proc.stderr and "Traceback" not in proc.stderr
    assert not db.exists()  # refused before anything was recorded


def test_no_driver_falls_back_to_the_default_sim_rig_and_says_so(tmp_path: Path) -> None:
    from gpudash.gpu.nvml import driver_available

    if driver_available() is None:
        pytest.skip("this machine has an NVIDIA driver; the fallback is for machines without one")
    db = tmp_path / "fallback.db"
    proc = run(tmp_path, "record", "--duration", "1", "--interval", "0.5", "--db", str(db), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "using the simulated rig sim:rtx5080+rtx3090" in proc.stderr
    assert query(db, "SELECT source FROM sessions") == [("sim:rtx5080+rtx3090",)]
    assert {i for (i,) in query(db, "SELECT DISTINCT [index] FROM gpu_samples")} == {0, 1}
    refused = run(tmp_path, "record", "--no-sim", "--duration", "1", "--db", str(tmp_path / "x.db"))
    assert refused.returncode == 2 and "drop --no-sim" in refused.stderr
    both = run(tmp_path, "record", "--sim", "h200", "--no-sim", "--duration", "1", "--db", str(tmp_path / "x.db"))
    assert both.returncode == 2 and "contradict" in both.stderr
