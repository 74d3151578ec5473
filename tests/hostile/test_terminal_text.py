"""Text from outside reaches the terminal as text: a process's name in `status`, fields of a database file in
`history`, a server's error body in `probe`, `serve` and the Events view, and anything a usage error quotes.
Escape sequences (a title set, a screen clear, a colour, 8-bit CSI) show as their escapes and Rich markup
stays literal. Through the real CLI and the real renderers."""

from __future__ import annotations

import io
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

from gpudash.commands.serve import STATUS_EVERY_S
from gpudash.commands.status import render
from gpudash.config import Config
from gpudash.records import Event, GpuProcessSample, GpuSample, Snapshot
from gpudash.store import Store
from gpudash.tui.widgets.tables import event_row, event_text
from hostile_helpers import ENTRY, WAIT_S, cli_env, gpudash
from hostile_server import ESCAPES, HostileServer

RAW = ("\x1b", "\x07", "\x9b")  # what a terminal acts on


def _shown_raw(text: str) -> list[str]:
    return [c for c in RAW if c in text]


def test_status_shows_a_process_name_as_text() -> None:
    """The name NVML reports is the process's own (any local user picks it): as root on a GPU box it went
    to the terminal raw."""
    snap = Snapshot(ts=1.0, tick=1, source="nvml", gpus=(GpuSample(1.0, 0, "GPU-0", "NVIDIA H200"),),
                    gpu_processes=(GpuProcessSample(1.0, 0, 4242, 1 << 30, name=ESCAPES, server=ESCAPES),))
    out = io.StringIO()
    render(snap, Console(file=out, width=300, color_system=None, force_terminal=False, highlight=False))
    assert _shown_raw(out.getvalue()) == [] and "\\x1b]0;owned" in out.getvalue()
    assert "[link=file:///etc/shadow]click[/link]" in out.getvalue()  # the markup shown, not obeyed


def test_history_shows_database_fields_as_text(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    with Store.open(db) as store:
        sid = store.begin_session("sim:h200", Config(), note="gpudash record")
        store.end_session(sid)
        store.db.execute("UPDATE sessions SET note = ?, source = ? WHERE id = ?", [ESCAPES, "sim:h200" + ESCAPES, sid])
        store.db.conn.commit()
    r = gpudash("history", "--db", str(db), home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _shown_raw(r.stdout) == [] and "\\x1b[2J" in r.stdout
    r = gpudash("history", "--json", "--db", str(db), home=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["sessions"][0]["note"] == ESCAPES  # JSON keeps it, escaped by JSON
    assert _shown_raw(r.stdout) == []


def test_probe_shows_an_error_body_as_text(tmp_path: Path) -> None:
    srv = HostileServer(mode="escapes").start()
    try:
        r = gpudash("probe", srv.url, "--requests", "2", home=tmp_path)
    finally:
        srv.close()
    assert r.returncode == 1 and "HTTP 500" in r.stderr, r.stderr
    assert _shown_raw(r.stdout + r.stderr) == [] and "\\x1b]0;owned" in r.stderr


def test_a_usage_error_shows_what_it_quotes_as_text(tmp_path: Path) -> None:
    r = gpudash("probe", "gopher://h\x1b]0;owned\x07\x1b[2J", home=tmp_path)
    assert r.returncode == 2 and _shown_raw(r.stderr) == [] and "\\x1b[2J" in r.stderr, r.stderr


def test_serve_shows_an_error_body_as_text(tmp_path: Path) -> None:
    srv = HostileServer(mode="escapes", metrics=True).start()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "a"\nurl = "{srv.url}"\nprobe = true\n[probe]\ninterval_s = 0.2\n')
    proc = subprocess.Popen([sys.executable, *ENTRY, "serve", "--config", str(cfg), "--db", str(tmp_path / "g.db"),
                             "--sim", "h200"], env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + WAIT_S
        while time.monotonic() < end and proc.poll() is None and not _failed_requests(tmp_path / "g.db"):
            time.sleep(0.2)
        time.sleep(STATUS_EVERY_S + 2)  # a status line, which names the last failure, came since
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT_S)
        srv.close()
    text = (out + err).decode("utf-8", "replace")
    assert proc.returncode == 0, text
    assert "failed, last: HTTP 500" in text and _shown_raw(text) == [], text[-3000:]


def _failed_requests(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return conn.execute("SELECT count(*) FROM requests WHERE NOT ok").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_the_events_view_shows_a_probe_error_as_text() -> None:
    e = Event(ts=1.0, actor="probe", kind="probe.error", target="a" + ESCAPES, old={"x": ESCAPES}, new=ESCAPES,
              ok=False, reason=f"HTTP 500: {ESCAPES}")
    cells = [c.plain if isinstance(c, Text) else c for c in event_row(e)]
    assert all(_shown_raw(str(c)) == [] for c in cells)
    detail = event_text(e)
    assert _shown_raw(detail.plain) == [] and "[link=file:///etc/shadow]" in detail.plain
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(detail)
    assert _shown_raw(out.getvalue()) == []


def test_records_status_line_shows_a_source_error_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    from gpudash.commands.record import _Progress, _status

    progress = _Progress()
    progress(Snapshot(ts=1.0, tick=1, source="sim:h200", errors=(f"a: /metrics scrape failed: {ESCAPES}",)))

    class Writer:
        rows_written = 1

    _status(1, "sim:h200", progress, Writer(), 5.0)
    err = capsys.readouterr().err
    assert "last tick had errors: a: /metrics scrape failed" in err and _shown_raw(err) == []


@pytest.mark.anyio
async def test_a_notice_shows_what_it_quotes_as_text() -> None:
    """A notice may quote a server's refusal or a failed action's error (`refused: ...`, `x failed: ...`):
    its escapes are shown, not obeyed, on the notice line above the keys."""
    from gpudash.tui.widgets.notices import NoticeLine
    from textual.app import App

    class One(App):
        def compose(self):
            yield NoticeLine(id="notices")

    app = One()
    async with app.run_test(size=(200, 5)) as pilot:
        line = app.query_one(NoticeLine)
        line.add(f"refused: sleep failed: HTTP 500 {ESCAPES}", "error")
        await pilot.pause(0.05)
        shown = str(line.content)
        assert _shown_raw(shown) == [] and "\\x1b]0;owned\\x07" in shown and "[link=file:///etc/shadow]" in shown
