"""Issue 37 item 3, the exporter's part: a server whose error body echoes its API key (or a secret flag or env
value gpudash passed it, or a URL's password) must not see it served as a label of
gpudash_server_probe_last_error_info. The sink is opened as `record`/`serve --prometheus` open it (open_sink
with the config), and scraped over real HTTP."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.config import Config
from gpudash.launcher.health import free_port
from gpudash.records import RequestSample, ServerSample, ServerState, Snapshot
from gpudash.telemetry.prometheus import open_sink

KEY = "sk-live-8f3a9c2e1d7b"  # what the api_key_env variable holds, with the newline a careless export leaves
FLAG = "hf_flagsecret_42"
ENV = "envsecret-value-99"


def test_the_last_probe_error_label_never_carries_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAT_API_KEY", KEY + "\n")
    config = Config.model_validate({
        "prometheus": {"gpu": "all"},
        "servers": [{"name": "chat", "kind": "vllm", "url": "http://127.0.0.1:8000", "probe": True,
                     "api_key_env": "CHAT_API_KEY"},
                    {"name": "code", "kind": "vllm", "model": "m", "env": {"HF_TOKEN": ENV},
                     "extra_args": ["--hf-token", FLAG]}],
    })
    errors = [("chat", f"HTTP 401: invalid key {KEY!r} (header 'Bearer {KEY}\\n')"),
              ("code", f"HTTP 400: bad request from --hf-token {FLAG} with HF_TOKEN={ENV}"),
              ("chat", "cannot connect to http://alice:S3cretPW@10.0.0.7:8000/v1 (refused)")]
    sink = open_sink(f"127.0.0.1:{free_port()}", config=config)
    try:
        seen = []
        for n, (name, error) in enumerate(errors):
            failed = RequestSample(float(n), name, ttft_s=None, total_s=0.1, prompt_tokens=None, cached_tokens=None,
                                   ok=False, error=error)
            server = ServerSample(float(n), name, "vllm", ServerState.READY)
            sink(Snapshot(float(n), n, "sim:h200", servers=(server,), requests=(failed,)))
            text = httpx.get(f"http://127.0.0.1:{sink.port}/metrics", trust_env=False).text
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            (info,) = [s for s in fams["gpudash_server_probe_last_error_info"].samples if s.labels["server"] == name]
            seen.append(info.labels["error"])
            assert KEY not in text and FLAG not in text and ENV not in text and "S3cretPW" not in text
    finally:
        sink.close()
    assert seen[0].startswith("HTTP 401: invalid key '***'") and "***" in seen[1] and "HTTP 400" in seen[1]
    assert "http://alice:***@10.0.0.7:8000" in seen[2]
