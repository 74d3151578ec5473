"""The probe and the API key (issue 37 item 3, the probe's part): an error body that echoes the key is masked
before the request row or the probe.error event is made (what the store, the exports and the exporter
read), a key read with a trailing newline is sent without it, and a launched server started with
`--api-key` in its extra_args gets that key on the probe's requests and on the scrape of its /metrics."""

from __future__ import annotations

import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from gpudash.config import ProbeConfig, ServerSpec
from gpudash.launcher.probe.runner import ProbeRunner
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox
from gpudash.telemetry.servers import ServerSource
from launcher_helpers import QuietHandler

KEY = "sk-probe-secret-0123456789abcdef"


class _EchoesTheKey(QuietHandler):
    """Lists a model; answers every chat with HTTP 401 whose body quotes the Authorization header it got."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.reply(200, b'{"data": [{"id": "m"}]}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/chat/completions":
            self.reply(404, b"{}")
            return
        said = self.headers.get("Authorization", "")
        self.reply(401, ('{"error": {"message": "invalid key ' + said + '", "type": "auth"}}').encode())


def test_an_echoed_key_is_masked_before_anything_is_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _EchoesTheKey)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("PROBE_KEY", KEY + "\n")  # as a key read from a file often is
    inbox = Inbox()
    sup = Supervisor([ServerSpec(name="ext", url=f"http://127.0.0.1:{srv.server_address[1]}", api_key_env="PROBE_KEY",
                                 probe=True, kind="llama.cpp")], inbox, tmp_path)
    source = ServerSource(sup)
    runner = ProbeRunner(sup, ProbeConfig(interval_s=0.05, prompt_tokens=8, max_tokens=2), inbox)
    requests: list = []
    events: list = []
    try:
        end = time.monotonic() + 30
        while len(requests) < 3 and time.monotonic() < end:
            source.poll()  # the attached server must read as ready before it is probed
            if runner._thread is None:
                runner.start()
            got = inbox.poll()
            requests += got["requests"]
            events += got["events"]
            time.sleep(0.1)
    finally:
        runner.stop()
        source.close()
        srv.shutdown()
        srv.server_close()
    failed = [r for r in requests if not r.ok]
    assert len(failed) >= 3
    texts = [r.error for r in failed] + [e.reason for e in events if e.kind == "probe.error"]
    assert texts and all(KEY not in t for t in texts), texts
    assert all("invalid key Bearer ***" in r.error and "\\n" not in r.error for r in failed)  # sent without the newline


@pytest.mark.llama
def test_a_launched_server_with_api_key_gets_it_from_the_probe_and_the_scrape(make_supervisor, tiny_model,
                                                                             llama_server) -> None:
    inbox = Inbox()
    sup = make_supervisor([ServerSpec(name="k", model=str(tiny_model), binary=llama_server, ctx_size=512,
                                      extra_args=["--api-key", KEY])])
    sup.start_all()
    source = ServerSource(sup)
    runner = ProbeRunner(sup, ProbeConfig(interval_s=0.05, prompt_tokens=16, max_tokens=2), inbox)
    requests: list = []
    try:
        runner.start()
        end = time.monotonic() + 60
        while len(requests) < 3 and time.monotonic() < end:
            requests += inbox.poll()["requests"]
            time.sleep(0.1)
        (st,) = source.poll()["servers"]
    finally:
        runner.stop()
        source.close()
    assert len(requests) >= 3 and all(r.ok for r in requests), [r.error for r in requests]  # not 401
    assert st.prefix_cache_queries is not None  # /metrics read with the key, not refused
