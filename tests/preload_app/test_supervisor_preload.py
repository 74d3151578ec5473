"""`[[servers]] engine = "preload"`: the supervisor starts the server with the environment `gpudash run`
gives a program; a real llama-server under the stand-in preload library publishes its block under the
server's name with the start-up knobs, and the telemetry tags its engine rows with that name."""

from __future__ import annotations

import pytest

from gpudash.preload import shm as P
from gpudash.config import Config, ServerSpec
from gpudash.launcher.errors import LaunchError
from gpudash.preload.knobs import PreloadKnobs, file_knobs
from gpudash.preload.source import PreloadSource
from preload_helpers import wait_for_block

pytestmark = pytest.mark.llama


def test_a_preload_server_runs_under_the_library(llama_server, tiny_model, stub_preload, make_supervisor,
                                                 monkeypatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "")
    cfg = Config.model_validate({"engine": {"staging_threads": 6, "h2d_chunk_bytes": "4MiB",
                                            "registration_cache_bytes": "1GiB"},
                                 "servers": [{"name": "pre", "model": str(tiny_model), "binary": llama_server,
                                              "engine": "preload"},
                                             {"name": "plain", "model": str(tiny_model), "binary": llama_server}]})
    assert file_knobs(cfg.engine) == {"h2d_chunk_bytes": 4 * 2**20, "staging_threads": 6}
    sup = make_supervisor(list(cfg.servers), preload_knobs=file_knobs(cfg.engine))
    sup.start_all()
    pids = sup.pids()
    (pre,) = [p for p, n in pids.items() if n == "pre"]
    (plain,) = [p for p, n in pids.items() if n == "plain"]
    wait_for_block(pre)
    with P.StatsView(pre) as view:
        s = view.read()
    assert s.name == "pre" and s.state == "active"
    assert s.knobs["staging_threads"] == 6 and s.knobs["h2d_chunk_bytes"] == 4 * 2**20
    assert s.knobs["outstanding"] == 2  # not set in the file: the library's default
    assert plain not in P.preload_pids()  # engine = "none" (the default) runs the server as it is
    rows = [r for r in PreloadSource(pids=sup.pids).poll()["engine_paths"] if r.server == "pre"]
    assert {(r.path, r.direction) for r in rows} == {("direct:0", "h2d"), ("direct:0", "d2h")}


def test_a_live_knob_change_outlives_a_restart(llama_server, tiny_model, stub_preload, make_supervisor,
                                               events) -> None:
    sup = make_supervisor([ServerSpec(name="pre", model=str(tiny_model), binary=llama_server, engine="preload")],
                          preload_knobs={"staging_threads": 6})
    sup.start("pre")
    PreloadKnobs(events.inbox, sup.pids, wait_s=0.0, remember=sup.preload_knobs.update).apply({"outstanding": 3})
    sup.restart("pre")
    (pid,) = sup.pids()
    wait_for_block(pid)
    with P.StatsView(pid) as view:
        knobs = view.read().knobs
    assert (knobs["outstanding"], knobs["staging_threads"]) == (3, 6)


def test_a_missing_library_fails_the_launch_naming_it(llama_server, tiny_model, make_supervisor, monkeypatch,
                                                      tmp_path, events) -> None:
    monkeypatch.setenv(P.PRELOAD_LIB_ENV, str(tmp_path / "absent.so"))
    sup = make_supervisor([ServerSpec(name="pre", model=str(tiny_model), binary=llama_server, engine="preload")])
    with pytest.raises(LaunchError, match=r"absent\.so is not a file.*or set engine = \"none\""):
        sup.start("pre")
    assert not sup.pids()
    assert any(e.kind == "server.start" and not e.ok for e in events.drain())
