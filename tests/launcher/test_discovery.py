"""Discovery: servers on the GPUs that gpudash did not start, from a fake NVML process list combined with
the real /proc command line of a llama-server the test started; written into a config with `w`'s
save_server, listed by `gpudash status`'s found lines, and the idle-box rule for the demo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudash.config import ConfigError, load_config, save_server
from gpudash.launcher.discovery import find_servers, found_lines, process_at, server_process
from gpudash.launcher.kinds import KINDS
from gpudash.runtime.stack import LaunchStack
from gpudash.telemetry.inbox import Inbox
from test_attach import llama_outside  # noqa: F401 - the fixture: a llama-server started outside gpudash


@pytest.mark.llama
def test_a_llama_server_on_a_gpu_is_found_with_its_address(llama_outside) -> None:  # noqa: F811
    proc, url = llama_outside
    fake_nvml = [(1, proc.pid), (0, os.getpid())]  # NVML's process list: the server on GPU 1, this test on 0
    (found,) = find_servers(fake_nvml)
    assert (found.pid, found.kind, found.url, found.gpus, found.answers, found.hint) == (
        proc.pid, "llama.cpp", url, (1,), True, None)
    assert found.cmdline[0].endswith("llama-server") and "--metrics" in found.cmdline
    assert find_servers(fake_nvml, known=[proc.pid]) == []  # launched or attached already: not "found"
    assert process_at(url) == (proc.pid, found.cmdline)
    lines = found_lines([found])
    assert lines[1] == f"  {found.name}: llama.cpp pid {proc.pid} on GPU 1 at {url} (answers)"


def test_a_worker_process_leads_to_its_server_and_a_silent_one_gets_a_hint() -> None:
    """vLLM's GPU process is a worker under `vllm serve`: the match walks up to it. Command lines here are
    given as NVML pids would map to them (the pids are fake, so their parents are never looked up)."""
    serve = ("/usr/bin/python3", "/usr/local/bin/vllm", "serve", "org/m", "--port", "1")
    assert server_process(4242, {4242: serve}) == (4242, serve)
    api = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--host", "127.0.0.1")
    assert KINDS["vllm"].matches(api) and KINDS["vllm"].address(api) == ("127.0.0.1", 8000)
    assert not KINDS["vllm"].matches(("python", "train.py", "serve"))
    (found,) = find_servers([(0, 4242)], cmdline={4242: serve})
    assert (found.kind, found.url, found.answers) == ("vllm", "http://127.0.0.1:1", False)
    assert found.hint == ("pid 4242 runs vLLM here but does not answer at http://127.0.0.1:1; add a [[servers]] "
                          "entry with the url its port is published at (url = \"http://HOST:PORT\")")


def test_w_writes_a_found_server_into_the_config(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[sampling]\ninterval_s = 2.0\n')
    save_server(path, {"name": "llamacpp-77", "kind": "llama.cpp", "url": "http://127.0.0.1:8080"})
    cfg = load_config(path)
    assert cfg.sampling.interval_s == 2.0 and cfg.servers[0].url == "http://127.0.0.1:8080"
    with pytest.raises(ConfigError, match="a server named 'llamacpp-77' is there already"):
        save_server(path, {"name": "llamacpp-77", "url": "http://127.0.0.1:9090"})
    before = path.read_text()
    with pytest.raises(ConfigError, match="model cannot go with url"):
        save_server(path, {"name": "x", "url": "http://h:1", "model": "m"})
    assert path.read_text() == before  # nothing half-written


def test_w_keeps_the_users_file_as_written_and_adds_after_it(tmp_path: Path) -> None:
    """The config is the user's: comments, order and layout stay; the entry is appended."""
    path = tmp_path / "c.toml"
    mine = '# my box\n[sampling]\ninterval_s = 2.0  # slow disk\n\n[[servers]]\nname = "a"\nurl = "http://h:1"'
    path.write_text(mine)
    save_server(path, {"name": "llamacpp-77", "kind": "llama.cpp", "url": "http://127.0.0.1:8080"})
    assert path.read_text().startswith(mine + "\n")
    assert [s.name for s in load_config(path).servers] == ["a", "llamacpp-77"]
    inline = tmp_path / "inline.toml"
    inline.write_text('servers = [{name = "a", url = "http://h:1"}]\n')
    with pytest.raises(ConfigError, match="inline array"):
        save_server(inline, {"name": "b", "url": "http://h:2"})
    assert inline.read_text() == 'servers = [{name = "a", url = "http://h:1"}]\n'


@pytest.mark.llama
def test_no_config_on_a_busy_box_attaches_instead_of_the_demo(llama_outside, tmp_path) -> None:  # noqa: F811
    from gpudash.config import Config

    proc, url = llama_outside
    inbox = Inbox()
    stack = LaunchStack(Config(), inbox, tmp_path / "logs", gpu_pids=lambda: [(0, proc.pid)])
    try:
        assert not stack.demo and [s.url for s in stack.specs] == [url]
        (event,) = inbox.poll()["events"]
        assert event.kind == "server.found" and event.new["pid"] == proc.pid
        stack.start()  # starts nothing: the attached server only gets read
        (st,) = stack.supervisor.states()
        assert (st.origin, st.pid) in (("attached", None), ("attached", proc.pid))
    finally:
        stack.close()
    assert proc.poll() is None
    idle = LaunchStack(Config(), Inbox(), tmp_path / "logs2", gpu_pids=lambda: [])
    assert idle.demo and idle.specs[0].name == "demo"


@pytest.mark.llama
def test_a_found_server_shows_as_a_row_and_one_command_attaches_it(llama_outside, events, tmp_path) -> None:  # noqa: F811
    from gpudash.runtime.control import AttachServer, Controller
    from gpudash.telemetry.servers import ServerSource
    from gpudash.launcher.supervisor import Supervisor
    from test_attach import read_until

    proc, url = llama_outside
    sup = Supervisor([], events.inbox, tmp_path / "logs")
    source = ServerSource(sup, gpu_pids=lambda: [(0, proc.pid)])
    try:
        # named where it listens (host:port), which a restart keeps; its pid is not in the name
        found = read_until(source, url.removeprefix("http://"), lambda s: s.state == "found")
        assert (found.origin, found.pid, found.url, found.error) == ("found", proc.pid, url, None)
        assert found.answers is True and found.up  # its /health answers 200: up, as the exporter says
        result = Controller(supervisor=sup, inbox=events.inbox).apply(AttachServer(found.server, found.kind, url))
        assert result.ok and result.event.kind == "server.attach"
        st = read_until(source, found.server, lambda s: s.state == "ready")
        assert (st.origin, st.kind, st.url) == ("attached", "llama.cpp", url)
        rows = [s for s in source.poll()["servers"] if s.server == found.server]
        assert len(rows) == 1  # attached now, no longer listed as found
        again = Controller(supervisor=sup, inbox=events.inbox).apply(AttachServer(found.server, "llama.cpp", url))
        assert not again.ok and "configured already" in again.reason
    finally:
        source.close()
    assert proc.poll() is None


def test_an_attached_server_on_another_host_makes_the_gpu_views_say_they_show_this_box_only(tmp_path) -> None:
    from gpudash.config import Config

    cfg = Config.model_validate({"servers": [{"name": "far", "url": "http://192.0.2.10:8000"},
                                             {"name": "near", "url": "http://127.0.0.1:8000"}]})
    stack = LaunchStack(cfg, Inbox(), tmp_path / "logs")
    try:
        assert stack.notes() == ["far run(s) on another host: the GPU views show this box's GPUs only"]
    finally:
        stack.close()


def test_status_lists_found_servers_and_none_on_a_simulated_rig(tmp_path, monkeypatch) -> None:
    import json

    from click.testing import CliRunner

    from gpudash.cli import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    r = CliRunner().invoke(main, ["status", "--sim", "h200", "--json", "--window", "0.05"])
    assert r.exit_code == 0, r.output
    # a simulated rig's GPU processes are modelled, not servers: a server found there is a real local process
    # found by its command line (another test's llama-server), on none of the simulated GPUs
    assert all(f["gpus"] == [] for f in json.loads(r.stdout)["found_servers"])


def test_a_found_server_is_exported_up_while_its_health_answers() -> None:
    """Issue 43 item 4: a found llama-server that answers /health 200 was exported as gpudash_server_up 0
    (an `up == 0` alert paged for a healthy server); one that does not answer is 0."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from gpudash.config import PrometheusConfig
    from gpudash.records import ServerSample, Snapshot
    from gpudash.telemetry.prometheus import PrometheusSink

    rows = tuple(ServerSample(ts=10.0, server=f"127.0.0.1:{port}", kind="llama.cpp", state="found", origin="found",
                              url=f"http://127.0.0.1:{port}", answers=ok) for port, ok in ((8080, True), (8081, False)))
    sink = PrometheusSink("127.0.0.1", 0, settings=PrometheusConfig())
    try:
        sink(Snapshot(10.0, 10, "sim:h200", servers=rows))
        text = httpx.get(f"http://127.0.0.1:{sink.port}/metrics", trust_env=False).text
    finally:
        sink.close()
    (up,) = [f for f in text_string_to_metric_families(text) if f.name == "gpudash_server_up"]
    assert {s.labels["server"]: s.value for s in up.samples} == {"127.0.0.1:8080": 1.0, "127.0.0.1:8081": 0.0}
