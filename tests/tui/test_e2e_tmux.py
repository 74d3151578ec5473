"""End to end: the real `gpudash launch --sim 8xh20` in a real terminal (tmux), driven with send-keys and
read with capture-pane; then the DB it recorded is checked, and nothing it started is left running."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

GPUDASH = Path(sys.executable).with_name("gpudash")
CONFIG = """\
[sampling]
interval_s = 0.5

[sim]
load = "light"

[probe]
enabled = false

[pools]
host_bytes = "8MiB"
device_bytes = "2MiB"
"""


SOCKET = f"gpudash-e2e-{uuid.uuid4().hex[:8]}"  # a private tmux server: the window size is ours alone


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, "-f", "/dev/null", *args], check=True, capture_output=True,
                          text=True).stdout


def wait_screen(session: str, *needles: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", session)
        if all(n in screen for n in needles):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"screen never showed {needles}; last screen:\n{screen}")


def test_launch_in_tmux_records_and_quits_cleanly(tmp_path: Path) -> None:
    assert shutil.which("tmux"), "tmux is needed for this test (.ci/run installs it)"
    assert GPUDASH.exists(), f"{GPUDASH} missing: install the package (pip install -e .)"
    cfg, db = tmp_path / "config.toml", tmp_path / "gpudash.db"
    cfg.write_text(CONFIG)
    session = "e2e"
    # COLUMNS/LINES from the test's environment would override the terminal's real size.
    cmd = f"env -u COLUMNS -u LINES {GPUDASH} --config {cfg} launch --sim 8xh20 --db {db}; echo GPUDASH-EXIT=$?; sleep 30"
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40", cmd)
    tmux("resize-window", "-t", session, "-x", "120", "-y", "40")
    try:
        screen = wait_screen(session, "SIM 8xh20", "REC ● on", "GPU7", db.name)
        assert all(f"GPU{i} H20 SIM" in screen for i in range(8))  # 8 cards fit at 120x40
        tmux("send-keys", "-t", session, "3")
        wait_screen(session, "demo", "ready", "log: demo")
        tmux("send-keys", "-t", session, "k")
        wait_screen(session, "sizes take 4MiB")
        for keys in (["C-a"], ["C-k"], ["8MiB"], ["Enter"]):  # typed like a person, not as one burst
            tmux("send-keys", "-t", session, *keys)
            time.sleep(0.3)
        tmux("send-keys", "-t", session, "5")
        wait_screen(session, "Engine paths", "h2d_chunk_bytes=8MiB")
        tmux("send-keys", "-t", session, "6")
        wait_screen(session, "sim-host", "sim-gpu7", "staging")  # the configured pools, sampled live
        tmux("send-keys", "-t", session, "8")
        wait_screen(session, "engine.knobs", "server.ready")
        tmux("send-keys", "-t", session, "q")
        wait_screen(session, "GPUDASH-EXIT=0", timeout=30)
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
    con = sqlite3.connect(db)
    [(source, ended, note)] = con.execute("SELECT source, ended, note FROM sessions").fetchall()
    assert source == "sim:8xh20" and ended is not None  # the session was closed cleanly
    assert note == "gpudash launch (demo)"  # what recorded it, for `history`'s "what" column
    listed = subprocess.run([str(GPUDASH), "history", "--db", str(db)], capture_output=True, text=True, check=True)
    assert "gpudash launch (demo)" in listed.stdout
    gpus = con.execute("SELECT count(DISTINCT [index]), count(*) FROM gpu_samples").fetchone()
    assert gpus[0] == 8 and gpus[1] >= 8 * 3
    kinds = [r[0] for r in con.execute("SELECT kind FROM events ORDER BY ts")]
    assert "engine.knobs" in kinds and kinds[-1] == "server.stop"
    new = con.execute("SELECT new FROM events WHERE kind = 'engine.knobs'").fetchone()[0]
    assert str(8 * 2**20) in new
    pools = {r[0] for r in con.execute("SELECT DISTINCT pool FROM pool_shard_samples")}
    own = {f"{p}-{where}" for p in ("sim", "engine") for where in ["host", *(f"gpu{i}" for i in range(8))]}
    assert pools == own  # [pools] (host + 8 GPUs) and the engine's staging (host) and relay (8 GPUs) pools
    pids = {r[0] for r in con.execute("SELECT DISTINCT pid FROM server_samples WHERE pid IS NOT NULL "
                                      "AND origin = 'managed'")}  # not the servers found running beside it
    assert pids, "the demo server's process never showed in the samples"
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"llama-server processes gpudash started are still running: {alive}"


def ready_recorded(db: Path) -> bool:
    try:
        return bool(sqlite3.connect(db).execute("SELECT count(*) FROM events WHERE kind = 'server.ready'").fetchone()[0])
    except sqlite3.OperationalError:  # not created or not migrated yet
        return False


def test_sigterm_stops_the_servers_and_closes_the_session(tmp_path: Path) -> None:
    cfg, db = tmp_path / "config.toml", tmp_path / "gpudash.db"
    cfg.write_text(CONFIG)
    cmd = f"exec env -u COLUMNS -u LINES {GPUDASH} --config {cfg} launch --sim h200 --db {db}"
    tmux("new-session", "-d", "-s", "term", "-x", "120", "-y", "40", cmd)
    try:
        wait_screen("term", "SIM h200", "GPU0")
        pid = int(tmux("list-panes", "-t", "term", "-F", "#{pane_pid}").split()[0])
        deadline = time.monotonic() + 30
        while not ready_recorded(db):
            assert time.monotonic() < deadline, "the demo server never became ready"
            time.sleep(0.2)
        psutil.Process(pid).terminate()
        psutil.Process(pid).wait(timeout=30)
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
    con = sqlite3.connect(db)
    assert con.execute("SELECT ended FROM sessions").fetchone()[0] is not None
    assert con.execute("SELECT kind FROM events ORDER BY ts DESC LIMIT 1").fetchone()[0] == "server.stop"
    pids = {r[0] for r in con.execute("SELECT DISTINCT pid FROM server_samples WHERE pid IS NOT NULL "
                                      "AND origin = 'managed'")}  # not the servers found running beside it
    assert pids and not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_80x24_keeps_help_quit_and_every_gpus_pcie(tmp_path: Path) -> None:
    """The smallest terminal people use: the real app at 80x24 still shows Help and Quit, the PCIe lines
    of all 8 GPUs, the DB file name, and a confirmation dialog that fits with all its answers."""
    cfg, db = tmp_path / "config.toml", tmp_path / "gpudash.db"
    cfg.write_text(CONFIG)
    cmd = f"env -u COLUMNS -u LINES {GPUDASH} --config {cfg} launch --sim 8xh20 --db {db}; echo GPUDASH-EXIT=$?; sleep 30"
    tmux("new-session", "-d", "-s", "small", "-x", "80", "-y", "24", cmd)
    tmux("resize-window", "-t", "small", "-x", "80", "-y", "24")
    try:
        screen = wait_screen("small", "SIM 8xh20", "GPU7", db.name)
        deadline = time.monotonic() + 10
        while (screen.count("TX "), screen.count("RX ")) != (8, 8) and time.monotonic() < deadline:
            time.sleep(0.2)  # the first frames come before the cards know their size
            screen = tmux("capture-pane", "-p", "-t", "small")
        assert (screen.count("TX "), screen.count("RX ")) == (8, 8), screen
        assert screen.splitlines()[-1].rstrip().endswith("?  Help  q  Quit"), screen
        assert "simulated" in screen.splitlines()[0], screen
        screen = wait_screen("small", "Processes by VRAM", "% CPU")  # kept under the cards; the demo's cost
        assert "DEMO" in screen.splitlines()[0] and db.name in screen.splitlines()[0], screen
        assert " D  Stop the demo" in screen.splitlines()[-1], screen  # one key, named in the footer
        assert (screen.count("TX "), screen.count("RX ")) == (8, 8), screen
        for key, title in zip("123456789", ("host CPU", "Split", "Servers", "TTFT", "Engine paths", "Memory pools",
                                             "Recorded sessions", "Events", "Processes")):
            tmux("send-keys", "-t", "small", key)
            tab = wait_screen("small", title)
            lines = tab.splitlines()
            assert all(len(line.rstrip()) <= 80 for line in lines), tab
            assert lines[-1].rstrip().endswith("?  Help  q  Quit") and "simulated" in lines[0], (key, tab)
            assert lines[1].split() == ["Overview", "Split", "Servers", "Latency", "Engine", "Pools", "History",
                                        "Events", "Processes", "Fleet"], (key, tab)  # every tab's title whole
        tmux("send-keys", "-t", "small", "?")
        wait_screen("small", "keys (up/down")
        tmux("send-keys", "-t", "small", "End")
        wait_screen("small", " quit ", "signal_process")  # the last keys, reached by keyboard
        tmux("send-keys", "-t", "small", "Escape")
        time.sleep(0.5)  # a lone Escape is told from the start of a key sequence by a pause
        tmux("send-keys", "-t", "small", "3")
        wait_screen("small", "demo", "ready", " S  Start  x  Stop  R  Restart", "more: ?")
        tmux("send-keys", "-t", "small", "x")
        dialog = wait_screen("small", "Stop demo?", "apply now", "discard")
        assert all(len(line.rstrip()) <= 80 for line in dialog.splitlines())
        tmux("send-keys", "-t", "small", "Escape")
        notice = wait_screen("small", "discarded: stop demo")
        assert notice.splitlines()[-2].strip() == "discarded: stop demo"  # its own line above the keys
        tmux("send-keys", "-t", "small", "D")  # one key stops the demo
        wait_screen("small", "DEMO stopped", "applied: stop demo")
        tmux("send-keys", "-t", "small", "q")
        wait_screen("small", "GPUDASH-EXIT=0", timeout=30)
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)


def test_160x48_every_tab_and_the_processes_of_the_box(tmp_path: Path) -> None:
    """A roomy terminal: the header says in full that the rig is simulated, the Overview lists the
    processes under the cards, and the Processes tab names the demo llama-server's user and command."""
    import getpass

    cfg, db = tmp_path / "config.toml", tmp_path / "gpudash.db"
    cfg.write_text(CONFIG)
    cmd = f"env -u COLUMNS -u LINES {GPUDASH} --config {cfg} launch --sim 8xh20 --db {db}; echo GPUDASH-EXIT=$?; sleep 30"
    tmux("new-session", "-d", "-s", "big", "-x", "160", "-y", "48", cmd)
    tmux("resize-window", "-t", "big", "-x", "160", "-y", "48")
    try:
        screen = wait_screen("big", "SIM 8xh20", "simulated rig, not real GPUs", "GPU7", "Processes by VRAM")
        tmux("send-keys", "-t", "big", "3")
        wait_screen("big", "demo", "ready")
        for key in "123456789":
            tmux("send-keys", "-t", "big", key)
            time.sleep(0.3)
            screen = tmux("capture-pane", "-p", "-t", "big")
            assert screen.splitlines()[-1].rstrip().endswith("?  Help  q  Quit"), (key, screen)
        screen = wait_screen("big", "Processes", "llama-server", getpass.getuser())
        tmux("send-keys", "-t", "big", "q")
        wait_screen("big", "GPUDASH-EXIT=0", timeout=30)
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
