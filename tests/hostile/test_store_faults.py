"""The store when the world goes wrong: kill -9, a full disk, a damaged file, a read-only filesystem, an
absurd session id. Each ends in one sentence and a usable (or untouched) file, never a traceback.

The full disk and the read-only filesystem are real: a small ext2 image loop-mounted (the `small_fs`
fixture, conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.records import GpuSample, HostSample, Snapshot
from gpudash.store import Store, StoreWriter
from hostile_helpers import Mount, gpudash

WAIT_S = 60.0


def _db_with_rows(path: Path, ticks: int = 4000) -> int:
    store = Store.open(path)
    sid = store.begin_session("sim:8xh20", Config())
    writer = StoreWriter(path, sid)
    for t in range(ticks):
        ts = 1_700_000_000.0 + t
        writer.submit(Snapshot(ts, t, "sim:8xh20", gpus=tuple(GpuSample(ts, i, f"u{i}", "H20", 1.0) for i in range(8)),
                               host=HostSample(ts, 5.0)))
    writer.close()
    store.end_session(sid)
    store.close()
    return sid


def _damage(path: Path) -> None:
    """Overwrite the middle fifth of the file (data and index pages alike) with noise."""
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(size * 2 // 5)
        f.write(os.urandom(size // 5))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("gpudash:")]) == 1, r.stderr


def test_export_of_a_damaged_db_fails_whole(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    sid = _db_with_rows(db)
    _damage(db)
    out = tmp_path / "out"
    r = gpudash("export", str(sid), "--db", str(db), "--format", "csv", "--out", str(out), home=tmp_path)
    assert r.returncode == 2
    _one_line(r)
    assert not out.exists() or list(out.iterdir()) == []  # no table files, no .partial


def test_record_refuses_to_append_to_a_damaged_db(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    _db_with_rows(db)
    _damage(db)
    before = _digest(db)
    r = gpudash("record", "--sim", "h200", "--duration", "1", "--db", str(db), "--quiet", home=tmp_path)
    assert r.returncode == 2
    _one_line(r)
    assert _digest(db) == before


@pytest.mark.parametrize("ref", [str(2**63), str(2**64 + 5), "0"])
def test_an_absurd_session_id_is_one_sentence(tmp_path: Path, ref: str) -> None:
    db = tmp_path / "g.db"
    _db_with_rows(db, ticks=3)
    r = gpudash("export", ref, "--db", str(db), "--format", "json", "--out", str(tmp_path / "o"), home=tmp_path)
    assert r.returncode == 2 and "no session" in r.stderr
    _one_line(r)


def test_kill_9_leaves_an_intact_db_and_an_interrupted_session(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "c")}
    p = subprocess.Popen([sys.executable, "-c", "from gpudash.cli import main; main()", "record", "--sim", "h200",
                          "--interval", "0.05", "--db", str(db), "--quiet"], env=env)
    try:
        end = time.monotonic() + WAIT_S
        ticks = 0
        while ticks < 5 and time.monotonic() < end and p.poll() is None:
            time.sleep(0.1)
            if db.exists():
                try:
                    with sqlite3.connect(db, timeout=5) as c:
                        ticks = c.execute("SELECT count(*) FROM ticks").fetchone()[0]
                except sqlite3.Error:
                    ticks = 0
        assert ticks >= 5
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        p.kill()
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    r = gpudash("history", "--db", str(db), "--json", home=tmp_path)
    assert r.returncode == 0, r.stderr
    (session,) = json.loads(r.stdout)["sessions"]
    assert session["state"] == "interrupted" and session["ended"] is None
    table = gpudash("history", "--db", str(db), home=tmp_path)
    assert "interrupted" in table.stdout


def test_a_full_disk_is_one_clean_error(small_fs: Mount, tmp_path: Path) -> None:
    db = small_fs.path / "g.db"
    Store.open(db).close()
    small_fs.fill(leave=1536 << 10)
    r = gpudash("record", "--sim", "8xh20", "--interval", "0.01", "--duration", "600", "--db", str(db), "--quiet",
                home=tmp_path, timeout=WAIT_S * 10)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.count("the store writer failed") == 1 and "disk is full" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) <= 3, r.stderr  # the failure, and at most a note that the end was not saved
    (small_fs.path / "filler").unlink()
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert c.execute("SELECT count(*) FROM ticks").fetchone()[0] > 0  # what was committed stayed


def test_a_read_only_db_is_refused_by_record(small_fs: Mount, tmp_path: Path) -> None:
    db = small_fs.path / "g.db"
    _db_with_rows(db, ticks=3)
    small_fs.read_only()
    r = gpudash("record", "--sim", "h200", "--duration", "1", "--db", str(db), "--quiet", home=tmp_path)
    assert r.returncode == 2 and "read-only" in r.stderr
    _one_line(r)
    h = gpudash("history", "--db", str(db), home=tmp_path)
    assert "Traceback" not in h.stderr


def test_a_read_only_export_dir_is_one_sentence(small_fs: Mount, tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    _db_with_rows(db, ticks=3)
    small_fs.read_only()
    r = gpudash("export", "latest", "--db", str(db), "--format", "csv", "--out", str(small_fs.path), home=tmp_path)
    assert r.returncode == 2 and "writable --out" in r.stderr
    _one_line(r)
