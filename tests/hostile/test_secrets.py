"""Secrets reach the server and nothing else: the server gets its env and flags unchanged, while the
session's config, the server.start events, the server log and every export hold masks; and the files
gpudash writes are 0600 in 0700 directories."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from gpudash.config import Config, ServerSpec
from gpudash.launcher.supervisor import Supervisor
from gpudash.redact import (MASK, mask_text, mask_values, redact_args, redact_env, remember, secret_name,
                            secret_values)
from gpudash.store import Store, StoreWriter
from gpudash.store.export import export_session
from gpudash.telemetry.inbox import Inbox

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "vllm_double.py"
SECRETS = ("hf_live_123", "sk-live-456", "pw-789")


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "--api-key",
                                  "--hf-token", "HUGGING_FACE_HUB_TOKEN", "KEY", "auth_header", "DB_PASS", "PASSPHRASE",
                                  "GCP_CREDENTIALS", "apiKey", "--x-authorization", "--ssl-keyfile", "MYTOKEN",
                                  "--openai.apikey", "monkey"])
def test_secret_names(name: str) -> None:
    """Any name part holding KEY, TOKEN, SECRET, PASS, AUTH or CREDENTIAL, in any case."""
    assert secret_name(name)


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "--port", "--model", "PATH", "--keep",
                                  "--max-num-batched-tokens", "--tokenizer", "--tokenizer-mode"])
def test_plain_names(name: str) -> None:
    assert not secret_name(name)


def test_values_after_any_secret_looking_flag_are_masked() -> None:
    args = ["--db-pass", "hunter22", "--openai-apikey", "sk-1", "--x-auth-header=Bearer abc", "--max-num-batched-tokens",
            "8192", "--credential-file", "/home/u/creds.json"]
    assert redact_args(args) == ["--db-pass", MASK, "--openai-apikey", MASK, f"--x-auth-header={MASK}",
                                 "--max-num-batched-tokens", "8192", "--credential-file", MASK]
    assert redact_env({"DB_PASS": "hunter22", "GCP_CREDENTIALS": "{}", "LOG_LEVEL": "info"}) == {
        "DB_PASS": MASK, "GCP_CREDENTIALS": MASK, "LOG_LEVEL": "info"}


def test_secret_values_are_masked_in_free_text() -> None:
    values = secret_values({"HF_TOKEN": "hf_abcdef", "X": "plain"}, ["--api-key", "sk-123456", "--hf-token=hf_9876"])
    line = "args: --api-key sk-123456 --hf-token=hf_9876 token hf_abcdef plain"
    assert mask_values(line, values) == f"args: --api-key {MASK} --hf-token={MASK} token {MASK} plain"


def test_flags_and_env_are_masked() -> None:
    args = ["--port", "8000", "--api-key", "sk-1", "--hf-token=hf_2", "--no-auth", "--verbose", "-m", "x"]
    assert redact_args(args) == ["--port", "8000", "--api-key", MASK, f"--hf-token={MASK}", "--no-auth", "--verbose",
                                 "-m", "x"]
    assert redact_env({"HF_TOKEN": "hf_1", "CUDA_VISIBLE_DEVICES": "0"}) == {"HF_TOKEN": MASK,
                                                                            "CUDA_VISIBLE_DEVICES": "0"}


def _stub(tmp: Path) -> Path:
    """A `vllm` that notes the secrets it was given, drops the flags the double does not know, and runs it."""
    exe = tmp / "vllm"
    got = tmp / "got.json"
    exe.write_text(f"""#!{sys.executable}
import json, os, runpy, sys
args = sys.argv[1:]
keep, given, skip = [], [], False
for a in args:
    if skip:
        given.append(a); skip = False
    elif a == "--api-key":
        skip = True
    elif a.startswith("--hf-token="):
        given.append(a.split("=", 1)[1])
    else:
        keep.append(a)
if not any(a.startswith("--help") for a in args):
    json.dump({{"env": os.environ.get("HF_TOKEN"), "args": given}}, open({str(got)!r}, "w"))
    print(f"non-default args: {{args}}, token {{os.environ.get('HF_TOKEN')}}", flush=True)  # as vLLM prints them
sys.argv = ["vllm", *keep]
runpy.run_path({str(DOUBLE)!r}, run_name="__main__")
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_secrets_reach_the_server_and_no_file(tmp_path: Path) -> None:
    spec = ServerSpec(name="v", kind="vllm", model="m", binary=str(_stub(tmp_path)),
                      env={"HF_TOKEN": SECRETS[0], "OTHER": "plain"},
                      extra_args=["--api-key", SECRETS[1], f"--hf-token={SECRETS[2]}"])
    inbox = Inbox()
    logs = tmp_path / "state" / "logs"
    sup = Supervisor([spec], inbox, logs)
    try:
        sup.start("v")
    finally:
        sup.stop_all()
    got = json.loads((tmp_path / "got.json").read_text())
    assert got == {"env": SECRETS[0], "args": [SECRETS[1], SECRETS[2]]}  # the server got them unchanged

    events = inbox.poll()["events"]
    start = next(e for e in events if e.kind == "server.start")
    assert start.new["env"]["HF_TOKEN"] == MASK and start.new["env"]["OTHER"] == "plain"
    log = sup.log_path("v")
    assert "non-default args" in log.read_text()  # the server's own line arrived, its secrets masked
    assert not any(s in log.read_text() for s in SECRETS)
    assert _mode(log) == 0o600 and _mode(logs) == 0o700 and _mode(logs.parent) == 0o700

    db = tmp_path / "data" / "g.db"
    store = Store.open(db)
    sid = store.begin_session("sim:h200", Config(servers=[spec]))
    for e in events:
        store.record_event(sid, e)
    writer = StoreWriter(db, sid)
    writer.close()
    assert not any(s in store.session_row(sid)["config"] for s in SECRETS)
    out = tmp_path / "exports" / "csv"
    files = export_session(store, sid, "csv", out)
    store.close()
    assert _mode(db) == 0o600 and _mode(db.parent) == 0o700
    assert _mode(out) == 0o700 and all(_mode(f.path) == 0o600 for f in files)
    for f in [db, *(f.path for f in files)]:
        assert not any(s.encode() in f.read_bytes() for s in SECRETS), f


def test_export_masks_secrets_of_a_db_written_before_masking(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "old.db")
    sid = store.begin_session("sim:h200", Config())
    store.db.execute("UPDATE sessions SET config = ? WHERE id = ?",
                     ['[[servers]]\nname = "a"\nmodel = "m"\nenv = { HF_TOKEN = "hf_live_123" }\n', sid])
    store.db.execute("INSERT INTO ticks (session_id, tick, ts) VALUES (?, 0, 1.0)", [sid])
    store.db.execute("INSERT INTO events (session_id, tick, ts, actor, kind, target, new, ok) VALUES "
                     "(?, 0, 1.0, 'supervisor', 'server.start', 'a', ?, 1)",
                     [sid, json.dumps({"extra_args": ["--api-key", "sk-live-456"]})])
    store.db.conn.commit()
    files = export_session(store, sid, "json", tmp_path / "out")
    store.close()
    for f in files:
        assert b"hf_live_123" not in f.path.read_bytes() and b"sk-live-456" not in f.path.read_bytes()


@pytest.mark.parametrize("text, shown", [
    ("GET http://alice:S3cret@host:8000/x failed", f"GET http://alice:{MASK}@host:8000/x failed"),
    ("https://ghp_token123@github.com/x", f"https://{MASK}@github.com/x"),
    ("probe alice:S3cret@127.0.0.1:80: refused", f"probe alice:{MASK}@127.0.0.1:80: refused"),
    ("'bob:pw@[::1]:9090'", f"'bob:{MASK}@[::1]:9090'"),
    ("mail root@example.org, ssh me@box, http://h:80/a@b", "mail root@example.org, ssh me@box, http://h:80/a@b"),
])
def test_url_credentials_are_masked_in_free_text(text: str, shown: str) -> None:
    assert mask_text(text) == shown


def test_a_remembered_secret_is_masked_as_given_stripped_and_escaped() -> None:
    remember(["sk-remembered-42\n", "abc", None])
    said = "Invalid header value b'Bearer sk-remembered-42\\n'; key sk-remembered-42\n; abc stays"
    assert mask_text(said) == f"Invalid header value b'Bearer {MASK}'; key {MASK}; abc stays"
