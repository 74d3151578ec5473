"""/dev/shm is every local user's: odd entries named like gpudash's blocks (a FIFO, a symlink, another
user's file, a name that is no pid) and blocks truncated under their readers and writers. Nothing hangs,
nothing crashes (neither gpudash nor the preloaded program), nothing raises, and the blocks are cleaned up.

The preloaded programs are real: libgpudash_preload.so as built, over the fake CUDA libraries of
tests/preload/fakes, driven by `gpudash run` or started directly.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudash.runtime.control import Controller, SetEngineKnobs
from gpudash.preload import shm as P
from gpudash.preload.knobs import PreloadKnobs
from gpudash.telemetry.inbox import Inbox
from gpudash.preload.source import PreloadSource
from hostile_helpers import ENTRY, WAIT_S

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("preload_fakebuild", HERE.parent / "preload" / "fakebuild.py")
fakebuild = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakebuild)  # type: ignore[union-attr]

NOBODY = 65534


@pytest.fixture(scope="module")
def copier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/hostile/data/copier.c linked against the fake CUDA libraries (built beside it)."""
    if fakebuild.find_preload() is None:
        pytest.fail(f"{fakebuild.PRELOAD} was not built; run `pip install -e .` or build build/dev with cmake")
    d = fakebuild.build_fakes(tmp_path_factory.mktemp("fakecuda"))
    return fakebuild.build_program(HERE / "data" / "copier.c", d / "copier")


def _env(copier: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDASH_")}
    return {**env, "LD_LIBRARY_PATH": str(copier.parent), "GPUDASH_PRELOAD_PUBLISH_MS": "5", **extra}


def _gpudash_run(tmp: Path, env: dict[str, str], *args: str, timeout: float = WAIT_S) -> subprocess.CompletedProcess:
    cfg = tmp / "gpudash.toml"
    cfg.write_text("")
    return subprocess.run([sys.executable, *ENTRY, "--config", str(cfg), "run", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def _blocks_of(pid: int) -> list[Path]:
    return [p for p in (P.SHM_DIR / f"{P.STATS_PREFIX}{pid}", P.SHM_DIR / f"{P.KNOBS_PREFIX}{pid}")
            if os.path.lexists(p)]


@pytest.fixture
def made() -> Iterator[list[Path]]:
    """Names a test makes in /dev/shm, removed afterwards (a FIFO is first opened for writing without
    waiting, which frees a reader stuck in its open)."""
    paths: list[Path] = []
    yield paths
    for p in paths:
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])


def _odd(kind: str, path: Path, made: list[Path], tmp: Path) -> None:
    made.append(path)
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "symlink":  # to a regular file of the right size: the link itself is what is refused
        target = tmp / "elsewhere"
        target.write_bytes(b"\0" * ctypes.sizeof(P.StatsBlockC))
        os.symlink(target, path)
    else:  # another user's regular file of the right size
        path.write_bytes(b"\0" * ctypes.sizeof(P.StatsBlockC))
        os.chown(path, NOBODY, NOBODY)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "foreign"])
def test_the_dashboard_skips_an_odd_entry_named_after_a_live_pid(kind: str, made: list[Path], tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    if kind == "foreign" and os.geteuid() != 0:
        pytest.skip("making another user's file needs root (CI runs this suite as root)")
    live = _sleeper()
    try:
        _odd(kind, P.SHM_DIR / f"{P.STATS_PREFIX}{live.pid}", made, tmp_path)
        source, polls = PreloadSource(), []
        with caplog.at_level(logging.DEBUG, logger=P.__name__):
            poller = threading.Thread(target=lambda: polls.extend(source.poll() for _ in range(3)), daemon=True)
            poller.start()
            poller.join(WAIT_S)
            assert not poller.is_alive(), f"the preload source hung on a {kind} in /dev/shm"
        assert live.pid not in P.preload_pids()
        assert all(not any(str(live.pid) in e for e in p["errors"]) for p in polls)
        notes = [r.getMessage() for r in caplog.records if str(live.pid) in r.getMessage()]
        assert len(notes) == 1, notes  # one debug line, not one a tick
    finally:
        live.kill()
        live.wait()


def test_gpudash_run_stats_does_not_hang_on_a_fifo_named_after_its_program(copier: Path, made: list[Path],
                                                                          tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    prog = (f"import os; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
            f"os.mkfifo('{P.SHM_DIR}/{P.STATS_PREFIX}%d' % os.getpid(), 0o600)")
    try:
        r = _gpudash_run(tmp_path, _env(copier), "--stats", "--", sys.executable, "-c", prog)
    finally:
        if pidfile.exists():
            made.append(P.SHM_DIR / f"{P.STATS_PREFIX}{pidfile.read_text()}")
    assert r.returncode == 0, r.stderr
    assert "published no engine stats" in r.stderr and "Traceback" not in r.stderr
    assert P.SHM_DIR.joinpath(f"{P.STATS_PREFIX}{pidfile.read_text()}").is_fifo()  # not gpudash's to remove


def test_odd_names_never_raise_and_a_knob_change_still_records_its_event(made: list[Path]) -> None:
    from gpudash.engine import EngineConfig, TransferEngine

    for tail in ("99999999999999999999", "²", "0012", "-5", " 7", "1e3"):
        path = P.SHM_DIR / f"{P.STATS_PREFIX}{tail}"
        made.append(path)
        path.write_bytes(b"\0" * ctypes.sizeof(P.StatsBlockC))
    assert not {12, 7, 1000, 99999999999999999999} & set(P.preload_pids())  # and no raise
    inbox = Inbox()
    eng = TransferEngine(EngineConfig(backend="sim", profile="h200"))
    try:
        c = Controller(engine=eng, inbox=inbox, preload=PreloadKnobs(inbox, lambda: {}))
        result = c.apply(SetEngineKnobs({"outstanding": 3}))
    finally:
        eng.close()
    assert result.ok, result.reason
    assert [e.kind for e in inbox.poll()["events"]] == ["engine.knobs"]


TRUNCATED_READ = """
import ctypes, os, struct, sys
from pathlib import Path
from gpudash.preload import shm as P
shm, pid = Path(sys.argv[1]), os.getpid()
for cls, prefix, kind in ((P.StatsBlockC, P.STATS_PREFIX, P.StatsView), (P.KnobsBlockC, P.KNOBS_PREFIX, P.KnobBlock)):
    block = cls()
    block.magic, block.version = P.MAGIC, P.VERSION
    (shm / f"{prefix}{pid}").write_bytes(bytes(block))
    view = kind(pid, shm)
    os.truncate(shm / f"{prefix}{pid}", 0)
    try:
        view.read()
    except P.BlockUnavailable as err:
        print("unavailable:", err)
    view.close()
"""


def test_a_block_truncated_under_its_reader_is_unavailable_not_sigbus(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", TRUNCATED_READ, str(tmp_path)], capture_output=True, text=True,
                       timeout=WAIT_S)
    assert r.returncode == 0, f"rc {r.returncode} ({-r.returncode == signal.SIGBUS and 'SIGBUS' or ''}) {r.stderr}"
    assert r.stdout.count("unavailable:") == 2 and "truncated" in r.stdout


def test_a_truncated_block_crashes_neither_the_program_nor_gpudash_run(copier: Path, tmp_path: Path) -> None:
    r = _gpudash_run(tmp_path, _env(copier), "--stats", "--name", "cut", "--", str(copier), "truncate")
    assert r.returncode == 0, f"rc {r.returncode}: {r.stderr}"  # 128 + SIGBUS was the failure
    pid = int(r.stdout.split()[0])
    assert f"engine stats of cut (pid {pid}, passthrough):" in r.stderr  # read after its normal exit
    assert _blocks_of(pid) == []


def test_a_program_shorter_than_the_first_look_still_has_its_stats(copier: Path, tmp_path: Path) -> None:
    for _ in range(5):
        r = _gpudash_run(tmp_path, _env(copier), "--stats", "--name", "quick", "--", str(copier), "quick")
        assert r.returncode == 0, r.stderr
        pid = int(r.stdout.split()[0])
        assert f"engine stats of quick (pid {pid}, passthrough):" in r.stderr, r.stderr  # after its exit
        assert _blocks_of(pid) == []


_PAD = "outstanding=" + "0" * 992 + "2,"  # 1006 characters: the old 1024-byte buffer cut the next item's last digit


@pytest.mark.parametrize("raw,state,knob", [
    ("outstanding=4294967298", "failed", "out of range"),
    ("h2d_fallback_bytes=18446744073709551615", "failed", "out of range"),
    ("h2d_fallback_bytes=18446744073709551616", "failed", "not name=integer"),
    ("h2d_chunk_bytes=-1", "failed", "not name=integer"),
    ("direct_first=2", "failed", "out of range"),
    (_PAD + "staging_threads=16", "passthrough", None),  # it ran, and at exit passes through
])
def test_raw_preload_knobs_are_read_as_the_knob_table_reads_them(copier: Path, raw: str, state: str,
                                                                 knob: str | None) -> None:
    lib = fakebuild.find_preload()
    env = _env(copier, LD_PRELOAD=str(lib), GPUDASH_PRELOAD_KNOBS=raw, **{P.KEEP_FOR_ENV: str(os.getpid())})
    r = subprocess.run([str(copier), "quick"], capture_output=True, text=True, env=env, timeout=WAIT_S)
    pid = int(r.stdout.split()[0])
    try:
        assert r.returncode == 0, r.stderr
        with P.StatsView(pid) as view:  # the blocks stayed for their parent (this test) to read
            s = view.read()
    finally:
        for p in _blocks_of(pid):
            p.unlink()
    assert s.state == state
    if knob is None:
        assert r.stderr == "" and s.knobs["staging_threads"] == 16 and s.knobs["outstanding"] == 2
    else:
        assert r.stderr.count("\n") == 1 and knob in r.stderr and "GPUDASH_PRELOAD_KNOBS" in r.stderr
