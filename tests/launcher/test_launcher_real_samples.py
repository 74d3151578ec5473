"""The launcher against what real servers print: samples under samples/, made from vLLM's and llama.cpp's
own sources and a real llama-server (PROVENANCE-*.txt says how each one was made)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.argv import MissingFlag, build_command
from gpudash.launcher.binary import parse_help
from gpudash.launcher.counters import Prev, parse_metrics
from gpudash.launcher.kinds.llama_cpp import llama_fields
from gpudash.launcher.kinds.llama_slots import decoding, kv_cells, states
from gpudash.launcher.kinds.vllm import vllm_fields

SAMPLES = Path(__file__).parent / "samples"


def text(name: str) -> str:
    return (SAMPLES / name).read_text()


VLLM_033 = parse_help(text("vllm-0.33.0-serve-help-all.txt")).supported()
VLLM_085 = parse_help(text("vllm-0.8.5-serve-help.txt")).supported()
LLAMA = parse_help(text("llama-server-help.txt")).supported()


def vllm(**kw) -> ServerSpec:
    return ServerSpec(name="v", kind="vllm", model="org/model", **kw)


def llama(**kw) -> ServerSpec:
    return ServerSpec(name="l", model="/m/a.gguf", **kw)


# ---- flags ----------------------------------------------------------------------------------------------

def test_vllm_033_lists_enable_disable_pairs_and_hides_no_enable() -> None:
    assert {"--enable-prefix-caching", "--disable-prefix-caching", "--enable-sleep-mode", "-pp",
            "--kv-offloading-size", "--kv-offloading-backend", "--max-num-seqs"} <= VLLM_033
    assert "--no-enable-prefix-caching" not in VLLM_033
    assert "--no-enable-prefix-caching" in VLLM_085 and "--disable-prefix-caching" not in VLLM_085


@pytest.mark.parametrize("flags, word", [(VLLM_033, "--disable-prefix-caching"),
                                         (VLLM_085, "--no-enable-prefix-caching")])
def test_prefix_caching_off_uses_the_spelling_the_release_lists(flags: frozenset[str], word: str) -> None:
    argv = build_command(vllm(enable_prefix_caching=False), "vllm", 8000, supported=flags).argv
    assert word in argv


def test_vllm_typed_fields_against_both_releases() -> None:
    spec = vllm(pipeline_parallel_size=2, max_model_len=8192, max_num_seqs=32, kv_offloading_size=8,
                kv_offloading_backend="lmcache", enable_sleep_mode=True)
    argv = build_command(spec, "vllm", 8000, supported=VLLM_033).argv
    assert argv[argv.index("--kv-offloading-backend") + 1] == "lmcache" and "--enable-sleep-mode" in argv
    with pytest.raises(MissingFlag) as err:  # 0.8.5 had no KV offloading to host memory
        build_command(spec, "vllm", 8000, supported=VLLM_085)
    assert err.value.option.field == "kv_offloading_size"


@pytest.mark.parametrize("extra", [["--no-enable-prefix-caching"], ["--max_model_len=4096"], ["-tp", "2"],
                                   ["--enable-log-stats"], ["--gpu-memory-utilization", "0.5"]])
def test_vllm_extra_args_that_vllm_parses_pass(extra: list[str]) -> None:
    assert build_command(vllm(extra_args=extra), "vllm", 8000, supported=VLLM_033).argv[-len(extra):] == tuple(extra)


def test_unknown_extra_arg_is_refused_by_name() -> None:
    with pytest.raises(MissingFlag) as err:
        build_command(vllm(extra_args=["--max-model-length", "4096"]), "vllm", 8000, supported=VLLM_033)
    assert (err.value.option.field, err.value.option.spellings) == ("extra_args", ("--max-model-length",))
    with pytest.raises(MissingFlag):
        build_command(llama(extra_args=["--draft-max", "8"]), "llama-server", 8080, supported=LLAMA)  # removed


def test_llama_typed_fields_against_the_real_help() -> None:
    spec = llama(flash_attn="auto", cache_reuse=256, cache_ram_mib=4096, fit="off", n_gpu_layers="all",
                 draft_model="/m/d.gguf", draft_max=8, extra_args=["-kvu", "--ctx-checkpoints", "4"])
    argv = build_command(spec, "llama-server", 8080, supported=LLAMA).argv
    pairs = {argv[i]: argv[i + 1] for i in range(len(argv) - 1)}
    assert (pairs["-fa"], pairs["--cache-reuse"], pairs["-cram"], pairs["-fit"], pairs["-ngl"]) == (
        "auto", "256", "4096", "off", "all")
    assert pairs["--spec-draft-n-max"] == "8" and "--draft-max" not in argv  # this build removed --draft-max


# ---- llama-server metrics and slots -----------------------------------------------------------------------

def test_llama_metrics_sample() -> None:
    m = parse_metrics(text("llama-server-metrics.txt"))
    f = llama_fields(m)
    # llamacpp:prompt_tokens_total counts computed tokens only; queries add the cached ones back
    assert (f["prefix_cache_queries"], f["prefix_cache_hits"]) == (1000, 499)
    assert "llamacpp:kv_cache_usage_ratio" not in m  # removed upstream: KV use comes from /slots
    later = dict(m, **{"llamacpp:prompt_tokens_total": m["llamacpp:prompt_tokens_total"] + 300})
    assert llama_fields(later, Prev(1, 0.0, m), 1, 2.0)["prompt_tokens_per_s"] == pytest.approx(150)


def test_llama_kv_usage_from_real_slots() -> None:
    slots = json.loads(text("llama-server-slots.json"))
    assert [s["n_ctx"] for s in slots] == [512, 512] and slots[0]["n_prompt_tokens"] == 507
    assert kv_cells(slots, unified=False) == (pytest.approx(507 / 1024), 1024)  # -c 1024 -np 2: 512 cells each
    assert kv_cells(slots, unified=True) == (pytest.approx(507 / 512), 512)
    assert kv_cells([], unified=False) == (None, None)
    # a server elsewhere (its flags unseen): 507 held fits one slot, so the layout cannot be told yet
    assert kv_cells(slots, unified=None) == (None, None)
    assert states(slots) == ((0, "idle", 507, 512), (1, "idle", 0, 512))


def test_tokens_in_flight_from_real_slots() -> None:
    """A busy slot's `next_token[].n_decoded` counts what a running request generated so far (the counter
    llamacpp:tokens_predicted_total adds it only when the request ends); idle slots add nothing."""
    assert decoding(json.loads(text("llama-server-slots.json"))) == 0  # taken after both requests finished
    busy = json.loads(text("llama-server-slots-busy.json"))  # taken while slot 1 generated
    assert [s["is_processing"] for s in busy] == [False, True]
    assert decoding(busy) == busy[1]["next_token"][0]["n_decoded"] > 0
    m = parse_metrics(text("llama-server-metrics-busy.txt"))
    assert m["llamacpp:tokens_predicted_total"] == 16  # only the two finished requests' 8 + 8


# ---- vLLM metrics -------------------------------------------------------------------------------------

def _dp2() -> tuple[dict[str, float], dict[str, float]]:
    return parse_metrics(text("vllm-0.33.0-metrics-dp2-a.txt")), parse_metrics(text("vllm-0.33.0-metrics-dp2-b.txt"))


def test_vllm_data_parallel_kv_is_the_fullest_engine_counters_summed() -> None:
    a, _ = _dp2()
    f = vllm_fields(a, None, 1, 0.0)
    # engines at 0.6 and 0.7: the fuller one (it preempts first), not their mean 0.65 nor their sum 1.3
    assert f["kv_cache_usage"] == pytest.approx(0.7) and f["kv_cache_usage_engines"] == (0.6, 0.7)
    assert (f["requests_running"], f["requests_waiting"]) == (7, 1)  # requests of both engines
    assert (f["prefix_cache_queries"], f["prefix_cache_hits"]) == (12000, 9000)
    assert f["state"] == "ready"  # vllm:engine_sleep_state{sleep_state="awake"} is 1 on both engines


def test_vllm_computed_prompt_rate_leaves_out_cache_hits() -> None:
    a, b = _dp2()
    f = vllm_fields(b, Prev(1, 100.0, a), 1, 110.0)
    whole = (b["vllm:prompt_tokens_total"] - a["vllm:prompt_tokens_total"]) / 10
    assert f["prompt_tokens_per_s"] == pytest.approx(whole / 4)  # 75 % came from the prefix cache
    # without the by-source counter: all prompt tokens minus the cached ones
    drop = [k for k in b if k.startswith("vllm:prompt_tokens_by_source")]
    a2, b2 = ({k: v for k, v in m.items() if k not in drop} for m in (a, b))
    assert vllm_fields(b2, Prev(1, 100.0, a2), 1, 110.0)["prompt_tokens_per_s"] == pytest.approx(whole / 4)


def test_vllm_draft_acceptance_is_per_interval() -> None:
    a, b = _dp2()
    assert vllm_fields(a, None, 1, 0.0)["draft_acceptance"] is None
    f = vllm_fields(b, Prev(1, 100.0, a), 1, 110.0)
    assert f["draft_acceptance"] == pytest.approx(0.2)  # the lifetime ratio would say 420 / 1200 = 0.35
    assert vllm_fields(a, Prev(1, 100.0, a), 1, 110.0)["draft_acceptance"] is None  # nothing drafted


def test_vllm_sleep_state_from_the_gauge() -> None:
    asleep = text("vllm-0.33.0-metrics-dp2-a.txt").replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0')
    assert vllm_fields(parse_metrics(asleep), None, 1, 0.0)["state"] == "sleeping"


def test_vllm_085_names_are_read() -> None:
    m = parse_metrics(text("vllm-0.8.5-metrics.txt"))
    f = vllm_fields(m, None, 1, 0.0)
    assert (f["kv_cache_usage"], f["prefix_cache_queries"], f["prefix_cache_hits"]) == (0.42, 200, 150)
    later = dict(m, **{"vllm:prompt_tokens_total": 4200.0})
    # 0.8.5 cannot tell computed from cached prompt tokens: no rate rather than an inflated one
    assert vllm_fields(later, Prev(1, 0.0, m), 1, 1.0)["prompt_tokens_per_s"] is None
