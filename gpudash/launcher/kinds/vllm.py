"""vLLM's `vllm serve`: its [[servers]] fields, command line, metrics, sleep mode and share.

The families read are those of vLLM 0.34.0's vllm/v1/metrics/loggers.py and vllm/v1/spec_decode/metrics.py
(VLLM_FAMILIES); 0.33 exports the same names less admission_rejections (0.34 adds it). Names of vLLM 0.8
(`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_queries/hits`, `vllm:time_per_output_token_seconds`)
are read when the current ones are absent. `vllm:prompt_tokens_total` counts the whole prompt, so computed
prompt tokens are its local-compute source (0.11+), else the whole prompt less `vllm:prompt_tokens_cached_total`.
KV-cache usage is the fullest data-parallel engine's: the one that preempts first.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from typing import Any


from gpudash.config.vllm import VllmSpec
from gpudash.config import ServerSpec
from gpudash.launcher import sleep as sleep_http
from gpudash.launcher.counters import (History, Prev, acceptance, buckets, first, per_engine, quantiles, rate, share,
                                       windowed_mean)
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.kinds.base import Option, ServerKind, program_name
from gpudash.records import ServerState

# Enforce-eager is switched on for vLLM when at least this many servers share one GPU (CUDA graphs
# reserve memory per server; several models on one card run out of it).
EAGER_SHARE_THRESHOLD = 3
_LOCAL_COMPUTE = 'vllm:prompt_tokens_by_source_total{source="local_compute"}'
_TTFT = "vllm:time_to_first_token_seconds"
_CACHE_INFO = "vllm:cache_config_info"
# The families gpudash reads (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py of 0.34.0; the 0.8
# names after them); nothing else on a /metrics answer is parsed.
VLLM_FAMILIES = frozenset({
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason",
    "vllm:engine_sleep_state", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits", "vllm:num_preemptions",
    "vllm:prompt_tokens", "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached", "vllm:generation_tokens",
    "vllm:request_success", "vllm:admission_rejections", "vllm:corrupted_requests", _TTFT,
    "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds", _CACHE_INFO, "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    # vLLM 0.8
    "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits",
    "vllm:time_per_output_token_seconds"})


def _num(x: float) -> str:
    return f"{x:g}"


def gpus_shared_count(spec: ServerSpec, peers: Sequence[ServerSpec]) -> int:
    """How many servers (this one included) share the busiest GPU of `spec`; empty `gpus` means all GPUs."""
    if not spec.gpus:
        return max(1, len(peers))
    return max(sum(1 for p in peers if not p.gpus or g in p.gpus) for g in spec.gpus)


def computed_prompt_rate(m: dict[str, float], prev: Prev | None, pid: int | None, now: float) -> float | None:
    """Prompt tokens vLLM computed per second: its local-compute source (0.11+), else all prompt tokens
    minus the cached ones, else (0.9-0.10, the V1 engine before either) minus the prefix-cache hits,
    which V1 counts in tokens; None on 0.8, whose V0 hit counters are in blocks."""
    if _LOCAL_COMPUTE in m:
        return rate(m, prev, pid, now, _LOCAL_COMPUTE)
    whole = rate(m, prev, pid, now, "vllm:prompt_tokens_total")
    cached = rate(m, prev, pid, now, first_name(m, "vllm:prompt_tokens_cached_total", "vllm:prefix_cache_hits_total"))
    return max(0.0, whole - cached) if whole is not None and cached is not None else None


def computed_prompt_tokens(m: dict[str, float]) -> float | None:
    """Prompt tokens vLLM computed since it started, as computed_prompt_rate counts them (None on 0.8)."""
    if _LOCAL_COMPUTE in m:
        return m[_LOCAL_COMPUTE]
    whole = m.get("vllm:prompt_tokens_total")
    cached = m.get(first_name(m, "vllm:prompt_tokens_cached_total", "vllm:prefix_cache_hits_total"))
    return max(0.0, whole - cached) if whole is not None and cached is not None else None


def first_name(m: dict[str, float], *names: str) -> str:
    """The first of `names` present in `m` (the last one when none is)."""
    return next((n for n in names if n in m), names[-1])


def kv_capacity(m: dict[str, float]) -> float | None:
    """KV-cache tokens over all engines, from cache_config_info: its kv_cache_size_tokens (0.34), else
    num_gpu_blocks times block_size."""
    if f"{_CACHE_INFO}.kv_cache_size_tokens" in m:
        return m[f"{_CACHE_INFO}.kv_cache_size_tokens"]
    blocks, size, n = (m.get(f"{_CACHE_INFO}.{k}") for k in ("num_gpu_blocks", "block_size", "count"))
    return blocks * size / n if blocks and size and n else None


def _finished(m: dict[str, float], reason: str) -> float | None:
    return m.get(f'vllm:request_success_total{{finished_reason="{reason}"}}')


def vllm_fields(m: dict[str, float], prev: Prev | None, pid: int | None, now: float,
                base: Prev | None = None, since: Prev | None = None) -> dict[str, Any]:
    """ServerSample fields from vLLM's `vllm:` metrics: token rates since `since` (the scrape RATE_WINDOW_S
    ago; None: `prev`), latency quantiles, means and the prefix-cache hit rate over the window since `base`
    (the last scrape when None), counters as they are."""
    base = base if base is not None else prev
    since = since if since is not None else prev
    queries = first_name(m, "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
    fields: dict[str, Any] = {
        "requests_running": m.get("vllm:num_requests_running"),
        "requests_waiting": m.get("vllm:num_requests_waiting"),
        "requests_waiting_capacity": m.get('vllm:num_requests_waiting_by_reason{reason="capacity"}'),
        "kv_cache_usage": first(m, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "kv_cache_usage_engines": per_engine(m, "vllm:kv_cache_usage_perc")
        or per_engine(m, "vllm:gpu_cache_usage_perc"),
        "kv_capacity_tokens": kv_capacity(m),
        # vLLM 0.8 counted these in blocks, later releases in tokens; their ratio is the hit rate either way.
        "prefix_cache_queries": first(m, "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_cache_hits": first(m, "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "prefix_cache_hit_rate": share(m, base, pid, first_name(m, "vllm:prefix_cache_hits_total",
                                                                "vllm:gpu_prefix_cache_hits_total"), queries),
        "tokens_per_s": rate(m, since, pid, now, "vllm:generation_tokens_total"),
        "prompt_tokens_per_s": computed_prompt_rate(m, since, pid, now),
        "rate_window_s": now - since.ts if since is not None and since.pid == pid and now > since.ts else None,
        "generation_tokens_total": m.get("vllm:generation_tokens_total"),
        "prompt_tokens_total": computed_prompt_tokens(m),
        "preemptions": m.get("vllm:num_preemptions_total"),
        "requests_finished": m.get("vllm:request_success_total"),
        "requests_aborted": _finished(m, "abort"),
        "requests_failed": _finished(m, "error"),
        "requests_rejected": m.get("vllm:admission_rejections_total"),
        "requests_corrupted": m.get("vllm:corrupted_requests_total"),
        "ttft_buckets": buckets(m, _TTFT),
        "ttft_sum_s": m.get(f"{_TTFT}_sum"),
        "ttft_count": m.get(f"{_TTFT}_count"),
        "ttft_mean_s": windowed_mean(m, base, pid, _TTFT),
        "prefill_mean_s": windowed_mean(m, base, pid, "vllm:request_prefill_time_seconds"),
    }
    itl = first_name(m, "vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count")
    for field, family in (("ttft", _TTFT), ("itl", itl.removesuffix("_count")),
                          ("queue", "vllm:request_queue_time_seconds"), ("e2e", "vllm:e2e_request_latency_seconds")):
        q = quantiles(m, base, pid, family) or {}
        if field == "ttft":
            fields.update(ttft_p50_s=q.get(0.5), ttft_p90_s=q.get(0.9), ttft_p99_s=q.get(0.99))
        else:
            fields.update({f"{field}_mean_s": windowed_mean(m, base, pid, family), f"{field}_p90_s": q.get(0.9),
                           f"{field}_p99_s": q.get(0.99)})
    # The KV offload connector's own lookups (kv_offloading_size): a hit source of its own
    fields["external_prefix_cache_queries"] = m.get("vllm:external_prefix_cache_queries_total")
    fields["external_prefix_cache_hits"] = m.get("vllm:external_prefix_cache_hits_total")
    fields["draft_acceptance"] = acceptance(m, prev, pid, "vllm:spec_decode_num_draft_tokens_total",
                                            "vllm:spec_decode_num_accepted_tokens_total")
    awake = m.get('vllm:engine_sleep_state{sleep_state="awake"}')  # mean over engines
    if awake is not None:  # a sleep or wake by anyone (another gpudash, curl) shows here
        fields["state"] = ServerState.SLEEPING if awake < 1 else ServerState.READY
    return fields


class Vllm(ServerKind):
    name = "vllm"
    label = "vLLM"
    spec_class = VllmSpec
    default_port = 8000
    metric_prefix = "vllm:"
    metric_families = VLLM_FAMILIES
    models_owner = "vllm"
    api_key_env = "VLLM_API_KEY"
    sleep_levels = (0, 1, 2)
    eager_field = "enforce_eager"
    own_series = {"requests_running": "vllm:num_requests_running", "requests_waiting": "vllm:num_requests_waiting",
                  "kv_cache_usage": "vllm:kv_cache_usage_perc", "prefix_cache_queries": "vllm:prefix_cache_queries",
                  "prefix_cache_hits": "vllm:prefix_cache_hits",
                  "external_prefix_cache_queries": "vllm:external_prefix_cache_queries",
                  "external_prefix_cache_hits": "vllm:external_prefix_cache_hits",
                  "kv_cache_usage_engines": "vllm:kv_cache_usage_perc", "kv_capacity_tokens": "vllm:cache_config_info",
                  "requests_waiting_capacity": "vllm:num_requests_waiting_by_reason",
                  "preemptions": "vllm:num_preemptions", "requests_finished": "vllm:request_success",
                  "requests_aborted": "vllm:request_success", "requests_failed": "vllm:request_success",
                  "requests_rejected": "vllm:admission_rejections", "requests_corrupted": "vllm:corrupted_requests",
                  "ttft_buckets": "vllm:time_to_first_token_seconds"}

    def find_binary(self, spec: ServerSpec) -> str:
        found = shutil.which("vllm")
        if found is None:
            raise LaunchError(spec.name, "vLLM's `vllm` command is not on PATH; install vLLM "
                                         "or set `binary` in its [[servers]] entry")
        return found

    def help_commands(self, binary: str) -> list[list[str]]:
        """vLLM >= 0.10 lists every flag only with `--help=all`."""
        return [[binary, "serve", "--help=all"], [binary, "serve", "--help"]]

    def head(self, spec: ServerSpec, binary: str) -> list[str]:
        return [binary, "serve", str(spec.model)]

    def options(self, spec: ServerSpec, port: int, peers: Sequence[ServerSpec]) -> list[Option]:
        """`vllm serve MODEL` options; memory utilization falls back to `share`, enforce-eager to the share count."""
        assert isinstance(spec, VllmSpec)
        opts = [
            Option("host", ("--host",), spec.host),
            Option("port", ("--port",), str(port)),
            # Cached-token counts in `usage` (what the probe measures); newer vLLMs always have it.
            Option("probe", ("--enable-prompt-tokens-details",), optional=True),
        ]
        util = spec.gpu_memory_utilization if spec.gpu_memory_utilization is not None else spec.share
        if util is not None:
            opts.append(Option("gpu_memory_utilization", ("--gpu-memory-utilization",), _num(util)))
        for field, flags in (("tensor_parallel_size", ("--tensor-parallel-size", "-tp")),
                             ("pipeline_parallel_size", ("--pipeline-parallel-size", "-pp")),
                             ("max_model_len", ("--max-model-len",)), ("max_num_seqs", ("--max-num-seqs",))):
            if getattr(spec, field) is not None:
                opts.append(Option(field, flags, str(getattr(spec, field))))
        if spec.kv_offloading_size is not None:
            opts.append(Option("kv_offloading_size", ("--kv-offloading-size",), _num(spec.kv_offloading_size)))
        if spec.kv_offloading_backend is not None:
            opts.append(Option("kv_offloading_backend", ("--kv-offloading-backend",), spec.kv_offloading_backend))
        eager = spec.enforce_eager
        if eager is None:
            eager = gpus_shared_count(spec, peers or [spec]) >= EAGER_SHARE_THRESHOLD
        if eager:
            opts.append(Option("enforce_eager", ("--enforce-eager",)))
        # vLLM >= 0.30 lists boolean pairs as --enable-x / --disable-x and hides the argparse --no-enable-x
        # form (which still parses); older releases list only --no-enable-x.
        if spec.enable_prefix_caching is True:
            opts.append(Option("enable_prefix_caching", ("--enable-prefix-caching",)))
        elif spec.enable_prefix_caching is False:
            opts.append(Option("enable_prefix_caching", ("--disable-prefix-caching", "--no-enable-prefix-caching")))
        if spec.enable_sleep_mode:
            opts.append(Option("enable_sleep_mode", ("--enable-sleep-mode",)))
        return opts

    def flag_for(self, setting: str) -> str | None:
        return {"share": "--gpu-memory-utilization", "tensor_parallel_size": "--tensor-parallel-size",
                "max_model_len": "--max-model-len"}.get(setting)

    def nccl_ranks(self, spec: ServerSpec) -> int:
        return getattr(spec, "tensor_parallel_size", None) or 1

    def env(self, spec: ServerSpec) -> dict[str, str]:
        """vLLM serves /sleep and /wake_up only in dev mode."""
        return {"VLLM_SERVER_DEV_MODE": "1"} if getattr(spec, "enable_sleep_mode", False) else {}

    def extra_flag(self, word: str) -> str | None:
        """vLLM's parser also takes `--max_model_len` and JSON paths like `--compilation-config.level` /
        `--x.key+`, which name `--max-model-len` and `--compilation-config`."""
        flag = super().extra_flag(word)
        if flag is not None and flag.startswith("--"):
            flag = "--" + flag[2:].split(".", 1)[0].rstrip("+").replace("_", "-")
        return flag

    def model_files(self, spec: ServerSpec) -> list[tuple[str, str]]:
        """A model that names a local path must exist (a Hugging Face id is fetched by vLLM)."""
        from pathlib import Path

        model = str(spec.model)
        return [("model", model)] if model.startswith(("/", ".", "~")) or Path(model).expanduser().exists() else []

    def at_share(self, spec: ServerSpec, share: float, gpu_totals: dict[int, int]) -> tuple[ServerSpec, str]:
        return (spec.model_copy(update={"share": share, "gpu_memory_utilization": share}),
                f"--gpu-memory-utilization {share:g}")

    def fields(self, m: dict[str, float], prev: Prev | None, pid: int | None, now: float,
               base: Prev | None = None, since: Prev | None = None) -> dict[str, Any]:
        return vllm_fields(m, prev, pid, now, base, since)

    def scrape(self, get: Callable[[str], tuple[int, bytes]], spec: ServerSpec | None, history: History,
               pid: int | None, now: float, cmdline: Sequence[str] | None = None
               ) -> tuple[dict[str, Any], dict[str, float]]:
        """/metrics, with the token rates over the last RATE_WINDOW_S (the base kind's are per tick)."""
        m = self.read_metrics(get)
        return self.fields(m, history.last, pid, now, history.start, history.since(now)), m

    def sleep_problem(self, spec: ServerSpec, level: int | None = None) -> str | None:
        if not getattr(spec, "enable_sleep_mode", False):
            return ("sleep and wake need a vLLM server started with enable_sleep_mode = true; set it in its "
                    "[[servers]] entry and restart it")
        if level is not None and level not in self.sleep_levels:
            return (f"sleep level {level} is not 0 (scheduling paused), 1 (weights to host memory) or 2 "
                    "(weights dropped)")
        return None

    def sleep(self, base_url: str, level: int) -> Any:
        return sleep_http.sleep_or_wake(base_url, "sleep", level)

    def wake(self, base_url: str) -> Any:
        return sleep_http.sleep_or_wake(base_url, "wake")

    def matches(self, cmdline: Sequence[str]) -> bool:
        """`vllm serve ...` (also run as `python .../vllm serve`), or `python -m vllm.entrypoints.openai.api_server`."""
        words = list(cmdline)
        if program_name(words).startswith("python") and len(words) > 1:
            if words[1] == "-m":
                return len(words) > 2 and words[2] == "vllm.entrypoints.openai.api_server"
            words = words[1:]
        return program_name(words) == "vllm" and len(words) > 1 and words[1] == "serve"
