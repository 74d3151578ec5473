"""Write the vLLM samples in this directory from vLLM's own sources (no GPU, no vLLM install needed).

Run: python tests/launcher/samples/render_vllm_samples.py WHEEL_0_33_DIR
where WHEEL_0_33_DIR is `pip download vllm==0.33.0 --no-deps` unpacked (`unzip vllm-0.33.0-*.whl`), with a
Python that has prometheus_client, regex and pyyaml (vLLM's argparse_utils.py imports the last two).
The help files were rendered with COLUMNS=100.

* vllm-0.33.0-serve-help-all.txt: vLLM 0.33.0's own FlexibleArgumentParser and EnableDisableAction
  (vllm/utils/argparse_utils.py, loaded from the wheel) format the flags gpudash uses, declared as
  vllm/engine/arg_utils.py and vllm/entrypoints/common/cli_args.py declare them (names, short forms, bool
  actions, choices; help texts shortened), exactly as `vllm serve --help=all` prints such entries.
* vllm-0.8.5-serve-help.txt: the same flags as vLLM 0.8.5 declares them (vllm/engine/arg_utils.py:
  --enforce-eager and --enable-sleep-mode are store_true, --enable-prefix-caching a plain argparse
  BooleanOptionalAction), formatted by stock argparse as 0.8.5's parser does.
* vllm-0.33.0-metrics-dp2-{a,b}.txt: two scrapes, 10 s apart, of a server with two data-parallel engines;
  metric names, types, help texts and labels are those of vllm/v1/metrics/loggers.py
  (PrometheusStatLogger) and vllm/v1/spec_decode/metrics.py in vLLM 0.33.0. Values are made up.
* vllm-0.8.5-metrics.txt: one engine with the names of vLLM 0.8.5's vllm/v1/metrics/loggers.py and
  vllm/v1/spec_decode/metrics.py. Values are made up.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import types
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

HERE = Path(__file__).parent
B = argparse.BooleanOptionalAction


def _flags(p: argparse.ArgumentParser, new: bool) -> None:
    store = {"action": B, "default": False} if new else {"action": "store_true"}
    g = p.add_argument_group("Frontend")
    g.add_argument("--host", type=str, default=None, help="Host name.")
    g.add_argument("--port", type=int, default=8000, help="Port number.")
    g.add_argument("--enable-prompt-tokens-details", help="If set to True, enable prompt_tokens_details in usage.",
                   **store)
    g = p.add_argument_group("ModelConfig")
    g.add_argument("--max-model-len", type=str, default=None, help="Model context length (prompt and output).")
    g.add_argument("--enforce-eager", help="Whether to always use eager-mode PyTorch.", **store)
    g.add_argument("--enable-sleep-mode", help="Enable sleep mode for the engine.", **store)
    g = p.add_argument_group("ParallelConfig")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1, help="Number of pipeline parallel groups.")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="Number of tensor parallel groups.")
    g.add_argument("--data-parallel-size", "-dp", type=int, default=1, help="Number of data parallel groups.")
    g.add_argument("--disable-custom-all-reduce", help="Disable the custom all-reduce kernel.",
                   **({"action": B, "default": False} if new else {"action": "store_true"}))
    g = p.add_argument_group("CacheConfig")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="The fraction of GPU memory to use.")
    g.add_argument("--enable-prefix-caching", action=B, default=None, help="Whether to enable prefix caching.")
    if new:
        g.add_argument("--kv-offloading-size", type=float, default=None,
                       help="Size of the KV cache offloading buffer in GiB.")
        g.add_argument("--kv-offloading-backend", type=str, choices=["native", "lmcache"], default="native",
                       help="The backend to use for KV cache offloading.")
    g = p.add_argument_group("SchedulerConfig")
    g.add_argument("--max-num-seqs", type=int, default=None, help="Maximum number of sequences per iteration.")
    g = p.add_argument_group("AsyncEngineArgs")
    g.add_argument("--disable-log-stats", help="Disable logging statistics.",
                   **({"action": B, "default": False} if new else {"action": "store_true"}))


def render_help(wheel: Path) -> None:
    fake = types.ModuleType("vllm.logger")
    fake.init_logger = logging.getLogger  # type: ignore[attr-defined]
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules["vllm.logger"] = fake
    spec = importlib.util.spec_from_file_location("vllm_argparse_utils", wheel / "vllm/utils/argparse_utils.py")
    assert spec is not None and spec.loader is not None
    au = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(au)
    p = au.FlexibleArgumentParser(prog="vllm serve", add_json_tip=False)
    p.add_argument("model_tag", nargs="?", help="The model tag to serve (optional if specified in config)")
    _flags(p, new=True)
    # FlexibleArgumentParser.format_help returns the full argparse help for --help=all.
    (HERE / "vllm-0.33.0-serve-help-all.txt").write_text(argparse.ArgumentParser.format_help(p))
    old = argparse.ArgumentParser(prog="vllm serve", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    old.add_argument("model_tag", nargs="?", help="The model tag to serve")
    _flags(old, new=False)
    (HERE / "vllm-0.8.5-serve-help.txt").write_text(old.format_help())


def _metrics_033(scale: float) -> bytes:
    r = CollectorRegistry()
    ln = ["model_name", "engine"]
    engines = [("org/model", "0"), ("org/model", "1")]
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", ln, registry=r)
    waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", ln, registry=r)
    sleep = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 "
                  "means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
                  "level 2.", ln + ["sleep_state"], registry=r)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", ln, registry=r)
    q = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", ln,
                registry=r)
    h = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", ln, registry=r)
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", ln, registry=r)
    by_src = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ln + ["source"],
                     registry=r)
    cached = Counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", ln,
                     registry=r)
    gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", ln, registry=r)
    drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", ln, registry=r)
    dtok = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", ln, registry=r)
    atok = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", ln, registry=r)
    ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ln,
                     buckets=(0.01, 0.1, 1.0, 10.0), registry=r)
    for i, (model, engine) in enumerate(engines):
        lv = (model, engine)
        running.labels(*lv).set(3 + i)
        waiting.labels(*lv).set(i)
        for state, v in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(*lv, state).set(v)
        kv.labels(*lv).set((0.6, 0.7)[i])
        total = 4000 * scale * (i + 1)  # 75 % of every prompt comes from the prefix cache
        q.labels(*lv).inc(total)
        h.labels(*lv).inc(0.75 * total)
        prompt.labels(*lv).inc(total)
        by_src.labels(*lv, "local_compute").inc(0.25 * total)
        by_src.labels(*lv, "local_cache_hit").inc(0.75 * total)
        by_src.labels(*lv, "external_kv_transfer").inc(0)
        cached.labels(*lv).inc(0.75 * total)
        gen.labels(*lv).inc(500 * scale * (i + 1))
        drafts.labels(*lv).inc(100 * scale)
        dtok.labels(*lv).inc(300 * scale)
        atok.labels(*lv).inc(150 if scale == 1 else 210)  # from a to b: 60 of the 300 new draft tokens accepted
        for _ in range(int(10 * scale)):
            ttft.labels(*lv).observe(0.05)
    return generate_latest(r)


def _metrics_085() -> bytes:
    r = CollectorRegistry()
    ln = ["model_name", "engine"]
    lv = ("org/model", "0")
    Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", ln, registry=r).labels(*lv).set(2)
    Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", ln, registry=r).labels(*lv).set(1)
    Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", ln,
          registry=r).labels(*lv).set(0.42)
    Counter("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries, in terms of number of queried blocks.", ln,
            registry=r).labels(*lv).inc(200)
    Counter("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in terms of number of cached blocks.", ln,
            registry=r).labels(*lv).inc(150)
    Counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", ln, registry=r).labels(*lv).inc(3200)
    Counter("vllm:generation_tokens_total", "Number of generation tokens processed.", ln,
            registry=r).labels(*lv).inc(640)
    return generate_latest(r)


def main() -> None:
    render_help(Path(sys.argv[1]))
    (HERE / "vllm-0.33.0-metrics-dp2-a.txt").write_bytes(_metrics_033(1))
    (HERE / "vllm-0.33.0-metrics-dp2-b.txt").write_bytes(_metrics_033(2))
    (HERE / "vllm-0.8.5-metrics.txt").write_bytes(_metrics_085())


if __name__ == "__main__":
    main()
