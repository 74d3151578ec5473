"""What a server's log says about speed: generation tokens/s and speculative-decoding acceptance.

llama-server prints, per finished request (tools/server/server-context.cpp `print_timings`):
``       eval time =   0.54 ms /  5 tokens (0.13 ms per token, 7462.69 tokens per second)`` and, with a
draft model, ``draft acceptance = 0.77000 ( 77 accepted / 100 generated), mean len = 1.50``. vLLM logs
``Avg generation throughput: 12.3 tokens/s`` and ``Draft acceptance rate: 77.0%`` periodically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LLAMA_EVAL = re.compile(r"(?<!prompt )\beval time\s*=.*?([0-9.]+) tokens per second")
_LLAMA_DRAFT = re.compile(r"draft acceptance\s*=\s*([0-9.]+)")
_VLLM_GEN = re.compile(r"Avg generation throughput:\s*([0-9.]+)\s*tokens/s")
_VLLM_DRAFT = re.compile(r"Draft acceptance rate:\s*([0-9.]+)\s*%")


@dataclass(frozen=True)
class LogFacts:
    """The latest values a log line revealed; None where no line said so yet."""

    tokens_per_s: float | None = None
    draft_acceptance: float | None = None


def parse_line(line: str, facts: LogFacts) -> LogFacts:
    """Facts updated with what `line` says (unchanged for lines that say nothing about speed)."""
    if m := _LLAMA_EVAL.search(line) or _VLLM_GEN.search(line):
        return LogFacts(float(m.group(1)), facts.draft_acceptance)
    if m := _LLAMA_DRAFT.search(line):
        return LogFacts(facts.tokens_per_s, float(m.group(1)))
    if m := _VLLM_DRAFT.search(line):
        return LogFacts(facts.tokens_per_s, float(m.group(1)) / 100.0)
    return facts
