"""LaunchStack (what `launch` and `serve` run) and the embedded demo's server list."""

from __future__ import annotations

import time

import pytest
from launcher_helpers import assert_gone

from gpudash.config import Config, ProbeConfig, ServerSpec
from gpudash.runtime.demo import DEMO_NAME, default_servers
from gpudash.runtime.stack import LaunchStack


def test_demo_servers_cache_their_model(tmp_path) -> None:
    (spec,) = default_servers(Config(probe=ProbeConfig(concurrency=3)), cache_dir=tmp_path)
    assert spec.name == DEMO_NAME and spec.kind == "llama.cpp" and spec.parallel == 3
    model = tmp_path / spec.model.rsplit("/", 1)[1]
    assert model.exists() and str(model) == spec.model
    mtime = model.stat().st_mtime_ns
    default_servers(Config(), cache_dir=tmp_path)
    assert model.stat().st_mtime_ns == mtime  # written once, then reused


@pytest.mark.llama
def test_stack_runs_servers_probe_and_scraper(tmp_path, events, tiny_model, llama_server) -> None:
    cfg = Config(servers=[ServerSpec(name="t", model=str(tiny_model), binary=llama_server, ctx_size=512)],
                 probe=ProbeConfig(interval_s=0.05, prompt_tokens=20, max_tokens=2))
    stack = LaunchStack(cfg, events.inbox, tmp_path / "logs")
    assert not stack.demo and [s.name for s in stack.specs] == ["t"]
    stack.start()
    try:
        requests = []
        deadline = time.monotonic() + 20
        while len(requests) < 3 and time.monotonic() < deadline:
            requests.extend(events.inbox.poll()["requests"])
            time.sleep(0.05)
        assert len(requests) >= 3 and all(r.ok and r.server == "t" for r in requests)
        (st,) = stack.sources[0].poll()["servers"]
        assert st.state == "ready" and st.prefix_cache_queries > 0
        pids = list(stack.supervisor.pids())
    finally:
        stack.close()
    assert_gone(pids)
    assert stack.supervisor.states()[0].state == "stopped"


def test_stack_without_probe(tmp_path, events, tiny_model) -> None:
    cfg = Config(servers=[ServerSpec(name="t", model=str(tiny_model))], probe=ProbeConfig(enabled=False))
    stack = LaunchStack(cfg, events.inbox, tmp_path / "logs")
    assert stack.probe is None
    stack.close()  # nothing started: closing is still clean
