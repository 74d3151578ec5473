"""`gpudash demo-model`, `gpudash probe` and `gpudash serve` as real subprocesses with their own dirs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from launcher_helpers import assert_gone, query
from gguf import GGUFReader

from gpudash.config import ServerSpec

REPO = Path(__file__).resolve().parents[2]


def _env(tmp: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH")]))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        e[var] = str(tmp / var.lower())
    return e


def gpudash(tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", *args],
                          capture_output=True, text=True, env=_env(tmp), cwd=tmp, timeout=timeout)


def test_demo_model_cli(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    r = gpudash(tmp_path, "demo-model", str(out), "--layers", "3")
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    assert len([t for t in GGUFReader(out).tensors if t.name.startswith("blk.")]) == 3 * 9
    bad = gpudash(tmp_path, "demo-model", str(tmp_path / "x.gguf"), "--embedding", "30")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert "must divide by heads" in bad.stderr and not (tmp_path / "x.gguf").exists()


@pytest.mark.llama
def test_probe_cli_records_and_prints(tmp_path: Path, make_supervisor, prefill_model, llama_server) -> None:
    sup = make_supervisor([ServerSpec(name="p", model=str(prefill_model), binary=llama_server, ctx_size=4096)])
    sup.start_all()
    url = sup.base_url("p")
    db = tmp_path / "probe.db"
    r = gpudash(tmp_path, "probe", url, "--requests", "8", "--prompt-words", "60", "--max-tokens", "2",
                "--db", str(db), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["summary"]["requests"] == 8 and out["summary"]["failed"] == 0
    assert out["summary"]["hits"] >= 3 and out["summary"]["correlation"]["n"] == 8
    rows = query(db, f"select ttft_s, cached_tokens, prompt_tokens from requests where session_id = {out['session']}")
    assert len(rows) == 8 and all(t > 0 for t, _, _ in rows) and any(c > 0 for _, c, _ in rows)
    text = gpudash(tmp_path, "probe", url, "--requests", "4", "--prompt-words", "20", "--max-tokens", "1")
    assert text.returncode == 0 and "Pearson" in text.stdout and "cache hits" in text.stdout


def test_probe_cli_unreachable(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = gpudash(tmp_path, "probe", f"http://127.0.0.1:{port}", "--requests", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"gpudash: cannot probe http://127.0.0.1:{port}")


def _serve(tmp: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from gpudash.cli import main; main()", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp), cwd=tmp)


def _wait_ready(proc: subprocess.Popen, timeout_s: float = 60) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if " ready at " in line:
            return lines
    proc.kill()
    raise AssertionError(f"serve never said ready: {lines}")


def _servers_of(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


@pytest.mark.llama
def test_serve_configured_then_sigterm(tmp_path: Path, tiny_model, llama_server) -> None:
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text(f'[probe]\ninterval_s = 0.1\nprompt_tokens = 20\nmax_tokens = 2\n\n'
                   f'[sampling]\ninterval_s = 0.2\n\n'
                   f'[[servers]]\nname = "tiny"\nmodel = "{tiny_model}"\nbinary = "{llama_server}"\nctx_size = 512\n')
    db = tmp_path / "serve.db"
    proc = _serve(tmp_path, "--config", str(cfg), "--db", str(db), "--sim", "h200", "--quiet")
    try:
        time.sleep(0.5)
        deadline = time.monotonic() + 60
        while not any("llama-server" in (c.name() or "") for c in psutil.Process(proc.pid).children()):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        servers = _servers_of(proc.pid)
        time.sleep(3.0)  # probe rounds and ticks
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_gone(servers)
    (sid,) = query(db, "select id from sessions where ended is not null and source = 'sim:h200'")[0]
    kinds = [k for (k,) in query(db, f"select kind from events where session_id = {sid} and target = 'tiny' order by ts")]
    assert kinds == ["server.start", "server.ready", "server.stop"]
    (n_req,) = query(db, f"select count(*) from requests where session_id = {sid} and ok = 1")[0]
    assert n_req >= 5
    states = {s for (s,) in query(db, f"select state from server_samples where session_id = {sid}")}
    assert {"ready", "stopped"} <= states
    (hits,) = query(db, f"select max(prefix_cache_hits) from server_samples where session_id = {sid}")[0]
    assert hits > 0


@pytest.mark.llama
def test_serve_bad_server_exits_2(tmp_path: Path, llama_server) -> None:
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text(f'[[servers]]\nname = "gone"\nmodel = "{tmp_path}/none.gguf"\nbinary = "{llama_server}"\n')
    db = tmp_path / "serve.db"
    r = subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", "serve", "--config", str(cfg),
                        "--db", str(db), "--sim", "h200", "--quiet"], capture_output=True, text=True,
                       env=_env(tmp_path), cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"gpudash: server 'gone': model file '{tmp_path}/none.gguf' does not exist; fix "
                                "`model` in its [[servers]] entry or run `gpudash demo-model` to make a test model")
    assert query(db, "select count(*) from sessions where ended is null") == [(0,)]


@pytest.mark.llama
def test_serve_demo_default(tmp_path: Path, llama_server) -> None:
    # No config at all: the embedded demo (generated model in the user cache dir) with the probe running.
    env_path = f"{Path(llama_server).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    db = tmp_path / "demo.db"
    env = _env(tmp_path) | {"PATH": env_path}
    proc = subprocess.Popen([sys.executable, "-c", "from gpudash.cli import main; main()", "serve", "--db", str(db),
                             "--sim", "h200"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path)
    try:
        lines = _wait_ready(proc)
        assert any("starting the demo server" in ln for ln in lines)
        servers = _servers_of(proc.pid)
        deadline = time.monotonic() + 30
        n = 0
        while n < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
            n = query(db, "select count(*) from requests where ok = 1")[0][0]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_gone(servers)
    assert n >= 3
    assert list((tmp_path / "xdg_cache_home" / "gpudash").glob("demo-llama-*.gguf"))
    rows = query(db, "select cached_tokens, prompt_tokens from requests where ok = 1")
    assert all(p > 0 for _, p in rows)


def test_serve_sigterm_while_loading_stops_the_loader(tmp_path: Path, tiny_model) -> None:
    slow = tmp_path / "slow-server"
    slow.write_text(f"#!{sys.executable}\nimport sys, time\n"
                    "if '--help' in sys.argv: print('-m  m\\n--host  h\\n--port  p\\n--metrics  x'); sys.exit(0)\n"
                    "time.sleep(600)\n")
    slow.chmod(0o755)
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text(f'[[servers]]\nname = "slow"\nmodel = "{tiny_model}"\nbinary = "{slow}"\n')
    proc = _serve(tmp_path, "--config", str(cfg), "--db", str(tmp_path / "s.db"), "--sim", "h200", "--quiet")
    try:
        deadline = time.monotonic() + 30
        while not _servers_of(proc.pid):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        loaders = _servers_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "interrupted while starting" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_gone(loaders)
    assert query(tmp_path / "s.db", "select count(*) from sessions where ended is null") == [(0,)]


@pytest.mark.llama
def test_status_lists_a_server_another_gpudash_runs_apart_and_keeps_wrapped_lines_indented(
        tmp_path: Path, tiny_model, llama_server) -> None:
    """Issue 45 item 17: with a TUI's demo running, `status` listed it under "inference servers gpudash did
    not start", and its long lines wrapped at 80 columns back to column 0."""
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text(f'[[servers]]\nname = "tiny"\nmodel = "{tiny_model}"\nbinary = "{llama_server}"\nctx_size = 512\n'
                   'extra_args = ["-t", "1"]\n')
    proc = subprocess.Popen([sys.executable, "-m", "gpudash", "serve", "--config", str(cfg), "--db",
                             str(tmp_path / "s.db"), "--sim", "h200", "--quiet"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=_env(tmp_path), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (children := [c.pid for c in psutil.Process(proc.pid).children() if "llama-server" in c.name()]):
            assert time.monotonic() < deadline and proc.poll() is None, "serve started no llama-server"
            time.sleep(0.1)
        (server,) = children
        out = subprocess.run([sys.executable, "-m", "gpudash", "status", "--sim", "h200", "--window", "0.05"],
                             capture_output=True, text=True, env={**_env(tmp_path), "COLUMNS": "80"}, cwd=tmp_path,
                             timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    ours = next(i for i, line in enumerate(lines) if f"pid {server} " in line)
    heading = max(i for i, line in enumerate(lines[:ours]) if not line.startswith(" "))
    assert lines[heading].startswith("inference servers another gpudash runs"), lines[heading:ours + 1]
    assert f"started by gpudash pid {proc.pid}" in " ".join(lines[ours:ours + 3])
    found = lines[lines.index(lines[heading]):]
    assert all(len(line) <= 80 for line in found), found
    assert all(line.startswith("  ") for line in found if not line.startswith("inference servers")), found
