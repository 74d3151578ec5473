"""A box's joules per generated token, from what its targets export (queries.ENERGY_PARTS' answers).

Energy is the box's GPUs' counters over the rate window: gpudash's `gpudash_gpu_energy_joules_total`, and
dcgm-exporter's `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ) for the GPUs gpudash does not count. Tokens come
from the first source the box has: the servers' own counters (vLLM's `vllm:generation_tokens_total` and
llama-server's `llamacpp:tokens_predicted_total`, which count every request and never the same server
twice), else gpudash's `gpudash_server_generation_tokens_total`. `sources` names the series each came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpudash.fleet.queries import ENERGY_PARTS

ENERGY = tuple(k.removeprefix("energy.") for k in ENERGY_PARTS if k.startswith("energy."))
TOKENS_OWN = ("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total")
TOKENS_GPUDASH = "gpudash_server_generation_tokens_total"


def _sum(parts: Mapping[str, Mapping[str, float]], names: Sequence[str], prefix: str,
         instances: Sequence[str]) -> tuple[float | None, list[str]]:
    """The sum over `instances` of each named part that has a value there, and the names that had one."""
    total, used = 0.0, []
    for name in names:
        values = [v for i in instances if (v := parts.get(f"{prefix}{name}", {}).get(i)) is not None]
        if values:
            total += sum(values)
            used.append(name)
    return (total if used else None), used


def box_energy(parts: Mapping[str, Mapping[str, float]], instances: Sequence[str]
               ) -> tuple[float | None, float | None, float | None, dict[str, str]]:
    """(watts, tokens per second, joules per token, sources) of the box whose targets are `instances`, from
    {part: {instance: value}}; joules per token is None without energy, or without a token in the window."""
    watts, energy_from = _sum(parts, ENERGY, "energy.", instances)
    tokens, tokens_from = _sum(parts, TOKENS_OWN, "tokens.", instances)
    if tokens is None:
        tokens, tokens_from = _sum(parts, (TOKENS_GPUDASH,), "tokens.", instances)
    sources = {}
    if energy_from:
        sources["energy"] = "+".join(energy_from)
    if tokens_from:
        sources["tokens"] = "+".join(tokens_from)
    per_token = watts / tokens if watts is not None and tokens else None
    return watts, tokens, per_token, sources
