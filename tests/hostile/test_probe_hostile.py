"""The probe against a server that stalls, floods, drips or answers nonsense: every request ends within its
deadline as one failed sample with one sentence, memory stays small, and the probe thread of launch/serve
lives on. A deadline here is a bound on the test's wait (a generous join), never a speed assertion."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest

from gpudash.config import ProbeConfig
from gpudash.launcher.probe.runner import ProbeRunner, model_id, probe_request, run_probe
from gpudash.launcher.probe.client import Cutoff, ProbeFailure
from gpudash.telemetry.inbox import Inbox
from hostile_helpers import gpudash
from hostile_server import CHAT_MODES, WRONG_MODELS, HostileServer
from launcher_helpers import OneServer

DEADLINE_S = 2.0
JOIN_S = 60.0  # how long a test waits for a probe that must end at its deadline
STARTUP_CAP_S = 400.0  # how long a CLI may take to start on a loaded machine (below pytest's 600 s timeout)


def _one(srv: HostileServer, deadline_s: float = DEADLINE_S):
    """One probe request run on a thread the test can give up on (so a hang fails instead of blocking)."""
    out: list = []

    def run() -> None:
        with httpx.Client(trust_env=False) as client:
            out.append(probe_request(client, srv.url, "m", "hello", 4, "h", deadline_s=deadline_s))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(JOIN_S)
    assert not t.is_alive(), f"the probe request in mode {srv.mode} did not end"
    return out[0]


def test_a_good_answer_is_read(hostile: HostileServer) -> None:
    s = _one(hostile)
    assert s.ok and s.ttft_s is not None
    assert (s.prompt_tokens, s.cached_tokens, s.completion_tokens, s.server_prompt_ms) == (7, 3, 1, 1.5)


@pytest.mark.parametrize("mode", [m for m in CHAT_MODES if m != "ok"])
def test_every_bad_mode_is_one_failed_request(hostile: HostileServer, mode: str) -> None:
    hostile.mode = mode
    s = _one(hostile)
    assert not s.ok
    assert s.error and "\n" not in s.error and "Traceback" not in s.error


@pytest.mark.parametrize("mode", ["never_ending", "drip", "silent", "silent_after_headers"])
def test_a_stalling_server_costs_the_deadline(hostile: HostileServer, mode: str) -> None:
    hostile.mode = mode
    s = _one(hostile)
    assert not s.ok and "deadline" in s.error


@pytest.mark.parametrize("mode,words", [("huge_line", "longer than"), ("huge_500", "HTTP 500"),
                                        ("empty_200", "no output"), ("chunk_list", "wrong shape"),
                                        ("usage_string", "usage"), ("timings_string", "timings"),
                                        ("bad_json", "not valid JSON"), ("nested", "not valid JSON")])
def test_the_failure_names_what_was_wrong(hostile: HostileServer, mode: str, words: str) -> None:
    hostile.mode = mode
    assert words in _one(hostile).error


def test_a_gigabyte_answer_costs_little_memory(hostile: HostileServer) -> None:
    me = psutil.Process()
    for mode in ("huge_line", "huge_500"):
        hostile.mode = mode
        before = me.memory_info().rss
        s = _one(hostile, deadline_s=30.0)
        assert not s.ok
        assert me.memory_info().rss - before < 64 << 20, f"{mode} grew the RSS by more than 64 MiB"


@pytest.mark.parametrize("mode", ["huge", "nested", "status_500", *WRONG_MODELS])
def test_a_bad_model_list_is_one_sentence(hostile: HostileServer, mode: str) -> None:
    hostile.models_mode = mode
    with httpx.Client(trust_env=False) as client, pytest.raises(ProbeFailure) as err:
        model_id(client, hostile.url, deadline_s=10.0)
    assert "/v1/models" in str(err.value) and "\n" not in str(err.value)


def test_a_silent_model_list_costs_the_deadline(hostile: HostileServer) -> None:
    hostile.models_mode = "silent"
    with httpx.Client(trust_env=False) as client, pytest.raises(ProbeFailure, match="did not answer within"):
        model_id(client, hostile.url, deadline_s=DEADLINE_S)


def _cancel_mid_request(hostile: HostileServer, mode: str, settle_s: float) -> float:
    """Four probe requests, two at a time, against `mode`, cancelled `settle_s` after the first one reached
    the server: every one ends as stopped. Returns how long the probe took to end after the cancel."""
    hostile.mode = mode
    cutoff = Cutoff()
    out: list = []
    t = threading.Thread(target=lambda: out.extend(run_probe(hostile.url, 4, concurrency=2, deadline_s=3600,
                                                             cutoff=cutoff)), daemon=True)
    t.start()
    assert hostile.chat_started.wait(JOIN_S)
    time.sleep(settle_s)
    t0 = time.monotonic()
    cutoff.cancel()
    t.join(JOIN_S)
    assert not t.is_alive()
    assert len(out) == 4 and all(not s.ok and s.error == "the probe was stopped" for s in out), \
        [(s.ok, s.error) for s in out]
    return time.monotonic() - t0


def test_cancel_ends_requests_in_flight(hostile: HostileServer) -> None:
    _cancel_mid_request(hostile, "never_ending", 0.0)


def test_cancel_ends_requests_still_waiting_for_their_headers(hostile: HostileServer) -> None:
    """A server that takes the request and never answers: no headers, so watch() has no socket yet; the
    cutoff knows the connection from httpcore's trace hook and a cancel still ends every request at once."""
    assert _cancel_mid_request(hostile, "silent", 0.2) < 10  # 0.2 s: the client waits for the headers


def _read_request(conn: socket.socket) -> bytes:
    """One HTTP request off `conn`: the head, then a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head


def test_a_keep_alive_connection_closed_as_it_is_reused_is_sent_again() -> None:
    """The server answers /v1/models keeping the connection alive, then closes it when the chat request comes
    on it, without a word (the race of a server's idle keep-alive timeout against the pool): the probe sends
    the request once more on a new connection and times that one, instead of failing it."""
    listener = socket.create_server(("127.0.0.1", 0))
    heads: list[bytes] = []
    models = b'{"object": "list", "data": [{"id": "m"}]}'
    stream = (b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
              b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}\n\ndata: [DONE]\n\n')

    def serve() -> None:
        first, _ = listener.accept()
        heads.append(_read_request(first))
        first.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                      + str(len(models)).encode() + b"\r\n\r\n" + models)
        heads.append(_read_request(first))
        first.close()  # the chat request on the kept-alive connection: closed unanswered
        second, _ = listener.accept()
        heads.append(_read_request(second))
        second.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + stream)
        second.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        [sample] = run_probe(f"http://127.0.0.1:{listener.getsockname()[1]}", 1, deadline_s=JOIN_S)
    finally:
        server.join(JOIN_S)
        listener.close()
    assert [h.split(b" ")[0] for h in heads] == [b"GET", b"POST", b"POST"]
    assert sample.ok and sample.error is None and sample.prompt_tokens == 5 and sample.ttft_s is not None



def test_the_probe_thread_outlives_bad_answers(hostile: HostileServer) -> None:
    inbox = Inbox()
    runner = ProbeRunner(OneServer(hostile.url), ProbeConfig(interval_s=0.05, timeout_s=5.0), inbox)
    got = []
    runner.start()
    try:
        for mode in ("chunk_list", "choices_strings", "usage_string", "timings_cache_list", "nested", "ok"):
            hostile.mode = mode
            seen = hostile.chat_requests
            end = time.monotonic() + JOIN_S
            while hostile.chat_requests < seen + 2 and time.monotonic() < end:
                got.extend(inbox.poll()["requests"])
                time.sleep(0.02)
        end = time.monotonic() + JOIN_S
        while not any(r.ok for r in got) and time.monotonic() < end:
            got.extend(inbox.poll()["requests"])
            time.sleep(0.02)
    finally:
        runner.stop()
    assert any(not r.ok and "wrong shape" in r.error for r in got)
    assert any(r.ok for r in got), "the probe stopped probing after the bad answers"


def test_cli_exits_1_when_every_request_fails(hostile: HostileServer, tmp_path) -> None:
    hostile.mode = "empty_200"
    r = gpudash("probe", hostile.url, "--requests", "3", "--timeout", "10", home=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "every request" in r.stderr and "Traceback" not in r.stderr


def test_cli_exits_0_when_requests_succeed(hostile: HostileServer, tmp_path) -> None:
    r = gpudash("probe", hostile.url, "--requests", "2", home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 requests (0 failed)" in r.stdout


@pytest.mark.parametrize("mode", ["models_list", "huge", "nested"])
def test_cli_bad_model_list_is_one_line_exit_2(hostile: HostileServer, tmp_path, mode: str) -> None:
    hostile.models_mode = mode
    r = gpudash("probe", hostile.url, "--requests", "1", "--timeout", "10", home=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "/v1/models" in r.stderr


def _first_request(srv: HostileServer, cli: subprocess.Popen, cap_s: float = STARTUP_CAP_S) -> bool:
    """Wait for the CLI's first chat request for as long as its start takes: on a loaded machine starting
    an interpreter and importing gpudash can take longer than JOIN_S, and the start is not what a test
    times. Gives up only when the CLI has exited or after `cap_s`."""
    end = time.monotonic() + cap_s
    while not srv.chat_started.wait(0.5):
        if cli.poll() is not None or time.monotonic() > end:
            return False
    return True


def test_ctrl_c_stops_the_cli_at_once(hostile: HostileServer, tmp_path) -> None:
    hostile.mode = "never_ending"
    # PYTHONFAULTHANDLER: should the CLI not end, SIGABRT makes it print every thread's stack for the report.
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "c"), "PYTHONFAULTHANDLER": "1"}
    # Ctrl-C at its default, as a shell starts a command in the foreground: a run started in the background
    # (`cmd &` without job control) ignores SIGINT, the CLI inherits that, and rightly goes on (a CI run
    # started so failed here, the CLI's main thread waiting for its requests, no KeyboardInterrupt raised).
    start = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "from gpudash.cli import main; main()")
    p = subprocess.Popen([sys.executable, "-c", start, "probe", hostile.url,
                          "--requests", "8", "--concurrency", "4", "--timeout", "3600"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert _first_request(hostile, p), f"the probe never sent a request (exit {p.poll()})"
        p.send_signal(signal.SIGINT)  # from here the CLI must end within JOIN_S, its requests at 3600 s
        try:
            _, err = p.communicate(timeout=JOIN_S)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGABRT)
            stacks = p.communicate(timeout=JOIN_S)[1]
            pytest.fail(f"the CLI still ran {JOIN_S:g} s after SIGINT; its threads then:\n{stacks[-8000:]}")
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert "Traceback" not in err
