"""A secret that comes back in text from outside is masked wherever gpudash writes: an attached server whose
error body quotes the API key it was sent (events.reason, requests.error, the exports), a key with a trailing
newline that httpx refuses to send (server_samples.error quotes the header), and a URL with its password
(sessions.note, requests.server, the terminal). Through the real `gpudash serve` and `gpudash probe`, a real
HTTP server and real SQLite files; every byte of what gpudash wrote is searched."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from gpudash.redact import MASK
from hostile_helpers import ENTRY, WAIT_S, cli_env, gpudash
from hostile_server import HostileServer

KEY = "sk-hostile-7f3a9c1e55"
PASSWORD = "S3cretPW-0xA1"


def _written(*roots: Path) -> dict[Path, bytes]:
    """Every file under `roots`, by path."""
    return {p: p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


def _rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db, timeout=10) as conn:
        return conn.execute(sql).fetchall()


def _exports(db: Path, home: Path, out: Path) -> None:
    for fmt in ("csv", "json", "parquet"):
        r = gpudash("export", "latest", "--db", str(db), "--format", fmt, "--out", str(out / fmt), home=home)
        assert r.returncode == 0, r.stderr


def _serve_until(home: Path, db: Path, cfg: Path, key: str, sql: str) -> tuple[str, str]:
    """`gpudash serve` with the key in its environment, stopped (SIGTERM) once `sql` finds a row; its output."""
    env = {**cli_env(home), "HOSTILE_KEY": key}
    proc = subprocess.Popen([sys.executable, *ENTRY, "serve", "--config", str(cfg), "--db", str(db), "--sim", "h200"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + WAIT_S
        while time.monotonic() < end and proc.poll() is None:
            try:
                if db.exists() and _rows(db, sql):
                    break
            except sqlite3.OperationalError:  # the tables are not made yet
                pass
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err
    assert _rows(db, sql), f"no row matched {sql}; serve said: {err[-2000:]}"
    return out, err


def _config(tmp: Path, url: str) -> Path:
    cfg = tmp / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "a"\nurl = "{url}"\napi_key_env = "HOSTILE_KEY"\nprobe = true\n'
                   "[probe]\ninterval_s = 0.2\ntimeout_s = 10\n")
    return cfg


def test_an_error_body_that_quotes_the_key_is_masked_everywhere(tmp_path: Path) -> None:
    srv = HostileServer(mode="echo_key", metrics=True).start()
    try:
        db = tmp_path / "data" / "g.db"
        out, err = _serve_until(tmp_path, db, _config(tmp_path, srv.url), KEY,
                                "SELECT 1 FROM requests r, events e WHERE r.error LIKE '%invalid key%' "
                                "AND e.kind = 'probe.error'")
    finally:
        srv.close()
    assert f"Bearer {MASK}" in _rows(db, "SELECT error FROM requests WHERE error IS NOT NULL")[0][0]
    assert f"Bearer {MASK}" in _rows(db, "SELECT reason FROM events WHERE kind = 'probe.error'")[0][0]
    _exports(db, tmp_path, tmp_path / "out")
    written = _written(tmp_path / "data", tmp_path / "out")
    assert any(b"invalid key" in data for data in written.values())  # the error itself was written
    assert [p for p, data in written.items() if KEY.encode() in data] == []
    assert KEY not in out + err


def test_a_key_with_a_trailing_newline_is_masked_in_the_header_error(tmp_path: Path) -> None:
    srv = HostileServer(metrics=True).start()
    try:
        db = tmp_path / "data" / "g.db"
        out, err = _serve_until(tmp_path, db, _config(tmp_path, srv.url), KEY + "\n",
                                "SELECT 1 FROM server_samples WHERE error LIKE '%header%'")
    finally:
        srv.close()
    _exports(db, tmp_path, tmp_path / "out")
    written = _written(tmp_path / "data", tmp_path / "out")
    assert [p for p, data in written.items() if KEY.encode() in data] == []
    assert KEY not in out + err


def test_a_url_password_is_masked_in_the_store_the_exports_and_the_terminal(tmp_path: Path) -> None:
    srv = HostileServer().start()
    try:
        url = srv.url.replace("http://", f"http://alice:{PASSWORD}@")
        db = tmp_path / "data" / "g.db"
        r = gpudash("probe", url, "--requests", "2", "--db", str(db), home=tmp_path)
        rj = gpudash("probe", url, "--requests", "1", "--json", home=tmp_path)
        bad = gpudash("probe", url.replace("http://", "gopher://"), home=tmp_path)
    finally:
        srv.close()
    assert r.returncode == 0 and rj.returncode == 0, r.stderr + rj.stderr
    assert bad.returncode == 2 and f"alice:{MASK}@" in bad.stderr, bad.stderr
    assert f"alice:{MASK}@127.0.0.1" in r.stdout and f"alice:{MASK}@127.0.0.1" in rj.stdout
    assert _rows(db, "SELECT note FROM sessions")[0][0] == f"gpudash probe {url.replace(PASSWORD, MASK)}"
    assert {s for (s,) in _rows(db, "SELECT server FROM requests")} == {f"alice:{MASK}@{srv.url[7:]}"}
    _exports(db, tmp_path, tmp_path / "out")
    written = _written(tmp_path / "data", tmp_path / "out")
    assert [p for p, data in written.items() if PASSWORD.encode() in data] == []
    assert all(PASSWORD not in x for x in (r.stdout, r.stderr, rj.stdout, rj.stderr, bad.stderr))


@pytest.mark.parametrize("entry", ['url = "http://alice:{pw}@127.0.0.1:8000"', 'url = "http://{pw}@127.0.0.1:8000/x"'])
def test_a_rejected_url_does_not_repeat_its_password(tmp_path: Path, entry: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "a"\n{entry.format(pw=PASSWORD)}\n')
    r = gpudash("--config", str(cfg), "config", "show", home=tmp_path)
    assert r.returncode == 2 and "url" in r.stderr and MASK in r.stderr, r.stderr
    assert PASSWORD not in r.stderr + r.stdout


def test_a_rejected_prometheus_url_does_not_repeat_its_password(tmp_path: Path) -> None:
    from gpudash.config import prometheus_url

    with pytest.raises(ValueError) as err:
        prometheus_url(f"http://bob:{PASSWORD}@prom.lan:9090")
    assert PASSWORD not in str(err.value) and f"bob:{MASK}@prom.lan" in str(err.value)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[fleet]\nprometheus = "http://bob:{PASSWORD}@prom.lan:9090"\n')
    r = gpudash("--config", str(cfg), "config", "show", home=tmp_path)
    assert r.returncode == 2 and PASSWORD not in r.stderr + r.stdout, r.stderr


def test_config_show_masks_secret_env_values_and_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[servers]]\nname = "v"\nkind = "vllm"\nmodel = "m"\n'
                   f'env = {{ HF_TOKEN = "{KEY}", LOG_LEVEL = "info" }}\n'
                   f'extra_args = ["--api-key", "{KEY}x", "--hf-token={KEY}y", "--port-offset", "3"]\n')
    r = gpudash("--config", str(cfg), "config", "show", home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert KEY not in r.stdout and f'HF_TOKEN = "{MASK}"' in r.stdout and 'LOG_LEVEL = "info"' in r.stdout
    shown = tomllib.loads(r.stdout)["servers"][0]
    assert shown["extra_args"] == ["--api-key", MASK, f"--hf-token={MASK}", "--port-offset", "3"]
    assert shown["env"] == {"HF_TOKEN": MASK, "LOG_LEVEL": "info"}


def test_a_secret_that_is_a_json_word_leaves_stored_and_exported_json_valid(tmp_path: Path, monkeypatch) -> None:
    """A secret masked as a word in JSON text ("true", "null") would break the JSON: it is masked as a value."""
    import json

    from gpudash import redact
    from gpudash.config import Config
    from gpudash.records import Event, Snapshot
    from gpudash.store import Store, StoreWriter
    from gpudash.store.export import export_session

    monkeypatch.setattr(redact, "_known", ())  # this process's secrets, for this test alone
    redact.remember(["true", "null-key-1"])
    path = tmp_path / "g.db"
    store = Store.open(path)
    sid = store.begin_session("sim:h200", Config(), note="true story")
    writer = StoreWriter(path, sid)
    event = Event(ts=1.0, actor="probe", kind="probe.error", target="a", old={"on": True, "none": None},
                  new={"said": "key null-key-1 is true"}, ok=False, reason="true")
    writer.submit(Snapshot(ts=1.0, tick=0, source="sim:h200", events=(event,), errors=("true: null-key-1",)))
    writer.close()
    old, new, reason = store.db.execute("SELECT old, new, reason FROM events").fetchone()
    assert json.loads(old) == {"on": True, "none": None} and json.loads(new) == {"said": f"key {MASK} is {MASK}"}
    assert reason == MASK and json.loads(store.db.execute("SELECT errors FROM ticks").fetchone()[0]) == [f"{MASK}: {MASK}"]
    files = {f.table: f.path for f in export_session(store, sid, "json", tmp_path / "out")}
    store.close()
    (row,) = json.loads(files["events"].read_text())
    assert json.loads(row["old"]) == {"on": True, "none": None}
    (tick,) = json.loads(files["ticks"].read_text())
    assert json.loads(tick["errors"]) == [f"{MASK}: {MASK}"]
    (session,) = json.loads(files["sessions"].read_text())
    assert tomllib.loads(session["config"])["probe"]["enabled"] is True and session["note"] == f"{MASK} story"
