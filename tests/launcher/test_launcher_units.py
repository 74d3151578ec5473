"""Pure pieces: help parsing, log lines, metric parsing, correlation, prompt mix, the GGUF writer."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from gpudash.launcher.binary import parse_help
from gpudash.launcher.probe.correlation import _ranks, ttft_hit_correlation, windowed
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.logparse import LogFacts, parse_line
from gpudash.launcher.counters import Prev, parse_metrics
from gpudash.launcher.kinds import KINDS
from gpudash.launcher.kinds.llama_cpp import TOKENS_GENERATED, llama_fields
from gpudash.launcher.kinds.vllm import vllm_fields
from gpudash.launcher.probe.runner import PromptMaker
from gpudash.records import RequestSample

LLAMA_HELP = """\
-m,    --model FNAME                    model path to load
                                        (env: LLAMA_ARG_MODEL)
-sm,   --split-mode {none,layer,row,tensor}
                                        how to split the model across multiple GPUs, one of:
--spec-draft-n-max N                    number of tokens to draft for speculative decoding (default: 3)
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
                                        --spec-ngram-mod-n-max
--draft-min, --draft-n-min N            the argument has been removed. use --spec-draft-n-min or
--metrics                               enable prometheus compatible metrics endpoint (default: disabled)
"""

ARGPARSE_HELP = """\
options:
  --gpu-memory-utilization GPU_MEMORY_UTILIZATION
                        The fraction of GPU memory to be used (e.g. -1 is not a flag)
  --enable-prefix-caching, --no-enable-prefix-caching
                        Enables automatic prefix caching.
  -tp TENSOR_PARALLEL_SIZE, --tensor-parallel-size TENSOR_PARALLEL_SIZE
"""


def test_parse_llama_help() -> None:
    h = parse_help(LLAMA_HELP)
    assert {"-m", "--model", "-sm", "--split-mode", "--spec-draft-n-max", "--metrics"} <= h.supported()
    assert {"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min"} == h.removed
    assert "--spec-ngram-mod-n-max" not in h.flags  # mentioned in a description, not offered


def test_parse_argparse_help() -> None:
    h = parse_help(ARGPARSE_HELP)
    assert h.supported() == {"--gpu-memory-utilization", "--enable-prefix-caching", "--no-enable-prefix-caching",
                             "-tp", "--tensor-parallel-size"}


@pytest.mark.parametrize("line, facts", [
    ("slot print_timing: id  0 | task 5 | prompt eval time =  8.64 ms /  90 tokens ( 0.10 ms per token, "
     "10419.08 tokens per second)", LogFacts()),
    ("slot print_timing: id  0 | task 5 |        eval time =       0.54 ms /     5 tokens (    0.13 ms per token,"
     "  7462.69 tokens per second)", LogFacts()),  # one request's decode speed: no throughput
    ("slot print_timing: id  0 | task 5 | draft acceptance = 0.77000 (   77 accepted /   100 generated), "
     "mean len =  1.50", LogFacts(0.77)),
    ("INFO 05-01 metrics.py:455] Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 55.5 tokens/s, "
     "Running: 1 reqs", LogFacts()),
    ("INFO SpecDecoding metrics: Draft acceptance rate: 61.5%, Accepted: 8 tokens", LogFacts(0.615)),
    ("srv  llama_server: model loaded", LogFacts()),
])
def test_log_lines(line: str, facts: LogFacts) -> None:
    assert parse_line(line, LogFacts()) == facts


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.8
"""


def test_vllm_fields_rates_over_the_interval() -> None:
    m = parse_metrics(VLLM_METRICS)
    first = vllm_fields(m, None, 7, 100.0)
    assert first["tokens_per_s"] is None and first["ttft_mean_s"] is None  # no interval yet
    assert (first["requests_running"], first["requests_waiting"], first["kv_cache_usage"]) == (2, 1, 0.25)
    assert (first["prefix_cache_queries"], first["prefix_cache_hits"]) == (1000, 600)
    prev = Prev(7, 100.0, dict(m))
    m2 = dict(m, **{"vllm:generation_tokens_total": 700.0, "vllm:time_to_first_token_seconds_count": 6.0,
                    "vllm:time_to_first_token_seconds_sum": 1.0})
    f = vllm_fields(m2, prev, 7, 102.0)
    assert f["tokens_per_s"] == pytest.approx(100.0) and f["ttft_mean_s"] == pytest.approx(0.1)
    assert vllm_fields(m2, prev, 8, 102.0)["tokens_per_s"] is None  # a new process: counters restarted


def test_llama_fields() -> None:
    m = {"llamacpp:prompt_tokens_total": 300.0, "llamacpp:prompt_tokens_cached_total": 700.0,
         "llamacpp:predicted_tokens_seconds": 42.0, "llamacpp:requests_processing": 1.0,
         "llamacpp:requests_deferred": 0.0, "llamacpp:spec_decode_num_draft_tokens_total": 0.0,
         "llamacpp:spec_decode_num_accepted_tokens_total": 0.0, TOKENS_GENERATED: 100.0}
    f = llama_fields(m)
    assert (f["prefix_cache_queries"], f["prefix_cache_hits"]) == (1000, 700)
    # the gauge (finished requests only, reset on every read) is not a rate of what the server does now
    assert f["tokens_per_s"] is None and f["draft_acceptance"] is None  # no interval, no drafting: unknown
    later = dict(m, **{TOKENS_GENERATED: 160.0})
    assert llama_fields(later, Prev(3, 10.0, m), 3, 12.0)["tokens_per_s"] == pytest.approx(30.0)


def _req(hit: float, ttft: float, ts: float = 0.0) -> RequestSample:
    return RequestSample(ts=ts, server="s", ttft_s=ttft, total_s=ttft, prompt_tokens=100,
                         cached_tokens=int(hit * 100))


def test_correlation_matches_numpy_and_ranks() -> None:
    rng = np.random.default_rng(1)
    hits = rng.uniform(0, 1, 40).round(2)
    ttft = 0.2 - 0.15 * hits + rng.normal(0, 0.01, 40)
    c = ttft_hit_correlation([_req(h, t) for h, t in zip(hits, ttft)])
    x = np.array([int(h * 100) / 100 for h in hits])
    assert c.n == 40
    assert c.pearson == pytest.approx(np.corrcoef(x, ttft)[0, 1])
    assert c.spearman == pytest.approx(np.corrcoef(_ranks(x), _ranks(ttft))[0, 1])
    assert c.pearson < -0.9 and c.spearman < -0.9


def test_ranks_average_ties() -> None:
    assert list(_ranks(np.array([10.0, 20.0, 10.0, 30.0]))) == [1.5, 3.0, 1.5, 4.0]


def test_correlation_undefined_cases() -> None:
    assert ttft_hit_correlation([_req(0.5, 0.1), _req(0.2, 0.2)]).pearson is None  # too few
    same_hit = ttft_hit_correlation([_req(0.5, t) for t in (0.1, 0.2, 0.3)])
    assert same_hit.pearson is None and same_hit.spearman is None and same_hit.n == 3
    failed = RequestSample(ts=0, server="s", ttft_s=None, total_s=None, prompt_tokens=None, cached_tokens=None,
                           ok=False, error="x")
    assert ttft_hit_correlation([failed]).n == 0


def test_windowed() -> None:
    reqs = [_req(h, 0.3 - h / 10, ts=t) for t, h in [(0, 0), (1, .5), (2, 1), (10, 1), (11, .5), (12, 0)]]
    w = windowed(reqs, 5.0)
    assert [start for start, _ in w] == [0.0, 10.0]
    assert all(c.pearson == pytest.approx(-1.0) and c.n == 3 for _, c in w)


@pytest.mark.parametrize("fraction, shared", [(0.0, 0), (0.25, 5), (0.5, 10), (1.0, 20)])
def test_prompt_mix_holds_the_fraction(fraction: float, shared: int) -> None:
    maker = PromptMaker(50, fraction, seed=3)
    prompts = [maker.next() for _ in range(20)]
    assert sum(s for _, s in prompts) == shared
    shared_prompts = [p for p, s in prompts if s]
    unshared = [p for p, s in prompts if not s]
    prefix = " ".join(shared_prompts[0].split()[:45]) if shared_prompts else None
    assert all(p.startswith(prefix) for p in shared_prompts)
    assert len({p.split()[0] for p in unshared}) == len(unshared)  # every miss starts differently


def test_gguf_writer_keys_and_tensors(tmp_path) -> None:
    path = write_demo_model(tmp_path / "m.gguf", DemoModelShape(layers=3, embedding=32, heads=4, heads_kv=2,
                                                                feed_forward=48))
    r = GGUFReader(path)

    def val(key: str):
        f = r.fields[key]
        return f.parts[f.data[0]][0]

    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "llama"
    assert (val("llama.block_count"), val("llama.embedding_length"), val("llama.feed_forward_length")) == (3, 32, 48)
    assert (val("llama.attention.head_count"), val("llama.attention.head_count_kv")) == (4, 2)
    assert val("llama.rope.dimension_count") == 8
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "output_norm.weight", "output.weight", "blk.2.ffn_down.weight"} <= names
    assert len(names) == 3 + 9 * 3
    k = next(t for t in r.tensors if t.name == "blk.0.attn_k.weight")
    assert list(k.shape) == [32, 16]  # GGUF order: ne0 = embedding, ne1 = kv heads * head dim
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 259
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


def test_gguf_shape_validation() -> None:
    with pytest.raises(ValueError, match="must divide by heads"):
        DemoModelShape(embedding=30, heads=4)


def _script(path, body: str):
    import sys

    path.write_text(f"#!{sys.executable}\nimport sys\n{body}")
    path.chmod(0o755)
    return path


def test_help_is_cached_per_path_and_mtime(tmp_path) -> None:
    import os

    from gpudash.launcher.binary import binary_flags

    calls = tmp_path / "calls"
    exe = _script(tmp_path / "srv", f"open({str(calls)!r}, 'a').write('x')\nprint('-m, --model F  m\\n--port P  p')\n")
    assert binary_flags(KINDS["llama.cpp"], str(exe)).supported() == {"-m", "--model", "--port"}
    binary_flags(KINDS["llama.cpp"], str(exe))
    assert calls.read_text() == "x"
    st = exe.stat()
    os.utime(exe, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a rebuilt binary is asked again
    binary_flags(KINDS["llama.cpp"], str(exe))
    assert calls.read_text() == "xx"


def test_old_vllm_help_fallback(tmp_path) -> None:
    from gpudash.launcher.binary import binary_flags

    # An older vLLM rejects --help=all (argparse: exit 2, usage only) but lists flags on --help.
    exe = _script(tmp_path / "vllm", "if '--help=all' in sys.argv:\n"
                                     "    print('usage: vllm serve [-h] [--host HOST]', file=sys.stderr); sys.exit(2)\n"
                                     "print('options:\\n  --host HOST\\n  --enforce-eager  Always use eager mode')\n")
    assert binary_flags(KINDS["vllm"], str(exe)).supported() == {"--host", "--enforce-eager"}


def test_help_without_flags_is_an_error(tmp_path) -> None:
    from gpudash.launcher.binary import binary_flags

    exe = _script(tmp_path / "nothing", "sys.exit(1)\n")
    with pytest.raises(RuntimeError, match=r"--help' \(exit 1\) listed no flags"):
        binary_flags(KINDS["llama.cpp"], str(exe))
