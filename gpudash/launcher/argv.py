"""Server spec -> command line and environment, as pure functions.

A spec field becomes an `Option` naming every spelling a flag has had across server releases (llama.cpp
renamed `--draft-max` to `--spec-draft-n-max`); given the flags a binary's `--help` lists, the first
spelling the binary supports is used, and a field whose flag the binary lacks raises `MissingFlag`.
Flags in a spec's `extra_args` are checked against the same help.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpudash.config import ServerSpec

# Enforce-eager is switched on for vLLM when at least this many servers share one GPU (CUDA graphs
# reserve memory per server; several models on one card run out of it).
EAGER_SHARE_THRESHOLD = 3


@dataclass(frozen=True)
class Option:
    """One flag a spec asks for: the spec field behind it, the flag's spellings (preferred first), its value."""

    field: str
    spellings: tuple[str, ...]
    value: str | None = None
    optional: bool = False  # used only when the binary's help lists it (a nicety, not something asked for)


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: dict[str, str]


class MissingFlag(Exception):
    """The binary supports none of an option's spellings."""

    def __init__(self, option: Option):
        super().__init__(option.spellings[0])
        self.option = option


def _num(x: float) -> str:
    return f"{x:g}"


def gpus_shared_count(spec: ServerSpec, peers: Sequence[ServerSpec]) -> int:
    """How many servers (this one included) share the busiest GPU of `spec`; empty `gpus` means all GPUs."""
    if not spec.gpus:
        return max(1, len(peers))
    counts = []
    for g in spec.gpus:
        counts.append(sum(1 for p in peers if not p.gpus or g in p.gpus))
    return max(counts) if counts else 1


def llama_options(spec: ServerSpec, port: int) -> list[Option]:
    """llama-server options for a spec (--metrics always: the dashboard scrapes it)."""
    opts = [
        Option("model", ("-m", "--model"), spec.model),
        Option("host", ("--host",), spec.host),
        Option("port", ("--port",), str(port)),
        Option("metrics", ("--metrics",)),
    ]
    if spec.split_mode is not None:
        opts.append(Option("split_mode", ("-sm", "--split-mode"), spec.split_mode))
    if spec.tensor_split is not None:
        opts.append(Option("tensor_split", ("-ts", "--tensor-split"), ",".join(_num(x) for x in spec.tensor_split)))
    if spec.n_gpu_layers is not None:
        opts.append(Option("n_gpu_layers", ("-ngl", "--gpu-layers", "--n-gpu-layers"), str(spec.n_gpu_layers)))
    if spec.ctx_size is not None:
        opts.append(Option("ctx_size", ("-c", "--ctx-size"), str(spec.ctx_size)))
    if spec.parallel is not None:
        opts.append(Option("parallel", ("-np", "--parallel"), str(spec.parallel)))
    if spec.cache_type_k is not None:
        opts.append(Option("cache_type_k", ("-ctk", "--cache-type-k"), spec.cache_type_k))
    if spec.cache_type_v is not None:
        opts.append(Option("cache_type_v", ("-ctv", "--cache-type-v"), spec.cache_type_v))
    if spec.draft_model is not None:
        opts.append(Option("draft_model", ("-md", "--model-draft", "--spec-draft-model"), spec.draft_model))
        # Builds with --spec-type only speculate when told which kind; older ones do whenever -md is given.
        opts.append(Option("draft_model", ("--spec-type",), "draft-simple", optional=True))
    if spec.draft_max is not None:
        opts.append(Option("draft_max", ("--draft-max", "--spec-draft-n-max"), str(spec.draft_max)))
    if spec.draft_min is not None:
        opts.append(Option("draft_min", ("--draft-min", "--spec-draft-n-min"), str(spec.draft_min)))
    if spec.flash_attn is not None:
        opts.append(Option("flash_attn", ("-fa", "--flash-attn"), spec.flash_attn))
    if spec.cache_reuse is not None:
        opts.append(Option("cache_reuse", ("--cache-reuse",), str(spec.cache_reuse)))
    if spec.cache_ram_mib is not None:
        opts.append(Option("cache_ram_mib", ("-cram", "--cache-ram"), str(spec.cache_ram_mib)))
    if spec.fit is not None:
        opts.append(Option("fit", ("-fit", "--fit"), spec.fit))
    return opts


def vllm_options(spec: ServerSpec, port: int, peers: Sequence[ServerSpec]) -> list[Option]:
    """`vllm serve MODEL` options; memory utilization falls back to `share`, enforce-eager to the share count."""
    opts = [
        Option("host", ("--host",), spec.host),
        Option("port", ("--port",), str(port)),
        # Cached-token counts in `usage` (what the probe measures); newer vLLMs always have it.
        Option("probe", ("--enable-prompt-tokens-details",), optional=True),
    ]
    util = spec.gpu_memory_utilization if spec.gpu_memory_utilization is not None else spec.share
    if util is not None:
        opts.append(Option("gpu_memory_utilization", ("--gpu-memory-utilization",), _num(util)))
    if spec.tensor_parallel_size is not None:
        opts.append(Option("tensor_parallel_size", ("--tensor-parallel-size", "-tp"), str(spec.tensor_parallel_size)))
    if spec.pipeline_parallel_size is not None:
        opts.append(Option("pipeline_parallel_size", ("--pipeline-parallel-size", "-pp"),
                           str(spec.pipeline_parallel_size)))
    if spec.max_model_len is not None:
        opts.append(Option("max_model_len", ("--max-model-len",), str(spec.max_model_len)))
    if spec.max_num_seqs is not None:
        opts.append(Option("max_num_seqs", ("--max-num-seqs",), str(spec.max_num_seqs)))
    if spec.kv_offloading_size is not None:
        opts.append(Option("kv_offloading_size", ("--kv-offloading-size",), _num(spec.kv_offloading_size)))
    if spec.kv_offloading_backend is not None:
        opts.append(Option("kv_offloading_backend", ("--kv-offloading-backend",), spec.kv_offloading_backend))
    eager = spec.enforce_eager
    if eager is None:
        eager = gpus_shared_count(spec, peers) >= EAGER_SHARE_THRESHOLD
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


def options_for(spec: ServerSpec, port: int, peers: Sequence[ServerSpec] = ()) -> list[Option]:
    """The options a spec asks for; `peers` are all configured servers (for the shared-GPU count)."""
    if spec.kind == "vllm":
        return vllm_options(spec, port, peers or [spec])
    return llama_options(spec, port)


def render(options: Sequence[Option], supported: Collection[str] | None = None) -> list[str]:
    """Options as argv words; with `supported`, each uses the first spelling the binary has (else MissingFlag).

    Without `supported` (nothing known about the binary) optional options are left out.
    """
    words: list[str] = []
    for opt in options:
        spelling = opt.spellings[0]
        if supported is None and opt.optional:
            continue
        if supported is not None:
            have = [s for s in opt.spellings if s in supported]
            if not have:
                if opt.optional:
                    continue
                raise MissingFlag(opt)
            spelling = have[0]
        words.append(spelling)
        if opt.value is not None:
            words.append(opt.value)
    return words


_NUMBER_RE = re.compile(r"^-[0-9.]")


def extra_flag(kind: str, word: str) -> str | None:
    """The flag an `extra_args` word names as --help would list it, or None for a value.

    `--x=1` names `--x`; vLLM's parser also takes `--max_model_len` and JSON paths like
    `--compilation-config.level` / `--x.key+`, which name `--max-model-len` and `--compilation-config`.
    """
    if not word.startswith("-") or _NUMBER_RE.match(word) or word == "-":
        return None
    flag = word.split("=", 1)[0]
    if kind == "vllm" and flag.startswith("--"):
        flag = "--" + flag[2:].split(".", 1)[0].rstrip("+").replace("_", "-")
    return flag


def check_extra_args(spec: ServerSpec, supported: Collection[str]) -> None:
    """MissingFlag for the first flag in `extra_args` that the binary's help does not list.

    An argparse negation the help hides (vLLM's `--no-enable-x`) counts when its positive form is listed,
    and a short flag glued to its value (`-O3`) when the short flag is.
    """
    for word in spec.extra_args:
        flag = extra_flag(spec.kind, word)
        if flag is None or flag in supported:
            continue
        if flag.startswith("--no-") and "--" + flag[5:] in supported:
            continue
        if not flag.startswith("--") and flag[:2] in supported:
            continue
        raise MissingFlag(Option("extra_args", (flag,)))


def build_command(spec: ServerSpec, binary: str, port: int, peers: Sequence[ServerSpec] = (),
                  supported: Collection[str] | None = None) -> Command:
    """The full argv and extra environment for one server (CUDA_VISIBLE_DEVICES from `gpus`; vLLM's
    dev-mode endpoints /sleep and /wake_up when sleep mode is on). With `supported`, `extra_args` are
    checked against it too."""
    head = [binary, "serve", spec.model] if spec.kind == "vllm" else [binary]
    if supported is not None:
        check_extra_args(spec, supported)
    argv = head + render(options_for(spec, port, peers), supported) + list(spec.extra_args)
    env = dict(spec.env)
    if spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
    if spec.kind == "vllm" and spec.enable_sleep_mode:
        env.setdefault("VLLM_SERVER_DEV_MODE", "1")
    return Command(tuple(argv), env)
