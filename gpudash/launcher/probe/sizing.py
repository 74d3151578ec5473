"""How many words make a probe prompt of N tokens on this server, and how many tokens its slot holds.

`[probe] prompt_tokens` is in tokens, as the server counts a request's prompt (`usage.prompt_tokens`), but
the probe writes words, and a word is one token on one model and eight on another (the demo model's
tokenizer: 80 words gave 684-710 tokens). The server's own /tokenize counts a sample of the probe's words
(llama-server: {"content"} -> {"tokens"}; vLLM: {"prompt"} -> {"count"}) and the same sample as a chat
(llama-server: /apply-template, then /tokenize with its special tokens; vLLM: /tokenize {"messages"}): the
difference is what the chat template adds. The prompt must also fit the slot it lands in: llama-server says
a slot's context in /props (`default_generation_settings.n_ctx`, a per-slot figure with `-np`), vLLM its
`max_model_len` in /v1/models; the prompt leaves room for the answer, and FIT_SHARE of what is left for
the prompts' own spread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from gpudash.launcher.probe.client import MAX_BODY_BYTES, Cutoff, ProbeFailure, parse_json, read_capped

# Tokens left for the chat template's own (role markers, a generation prompt) where the server cannot say.
TEMPLATE_ROOM = 32
# Share of a slot's room (its context less the answer and the template) a fitted prompt takes: prompts of
# one size spread by a few percent in tokens.
FIT_SHARE = 0.95
# Words of the sample the server tokenizes to learn its tokens per word.
SAMPLE_WORDS = 200
ASK_DEADLINE_S = 10.0  # a server that takes longer to say its context or count a sample is not asked again
_RAW = {"Accept-Encoding": "identity"}


@dataclass(frozen=True)
class Size:
    """What the server said: tokens per probe word, the tokens its chat template adds, and a slot's context
    (None: it did not say)."""

    tokens_per_word: float | None
    template: int | None
    context: int | None

    def words_for(self, tokens: int, max_tokens: int) -> int:
        """Words for a prompt of `tokens` tokens as the server counts it (its chat template's included) that
        fits the slot with the answer's `max_tokens`; words = tokens when the server could not count."""
        template = self.template if self.template is not None else TEMPLATE_ROOM
        content = tokens - template
        if self.context is not None:
            content = min(content, int((self.context - max_tokens - template) * FIT_SHARE))
        content = max(1, content)
        return max(1, int(content / self.tokens_per_word)) if self.tokens_per_word else content


def _json(client: httpx.Client, method: str, url: str, deadline_s: float, cutoff: Cutoff,
          auth: dict[str, str], body: Any = None) -> Any:
    """A small JSON answer, within the deadline; None when the server does not serve it (an error status,
    no answer in time, something that is not JSON): the probe then goes on without it."""
    deadline = time.monotonic() + min(deadline_s, ASK_DEADLINE_S)
    try:
        with client.stream(method, url, json=body, headers={**_RAW, **auth}, timeout=cutoff.timeout(deadline),
                           extensions=cutoff.extensions) as r, cutoff.watch(r, deadline) as fired:
            if r.status_code != 200:
                return None
            data = read_capped(r, MAX_BODY_BYTES, deadline)
            if fired.is_set():
                return None
        return parse_json(data, url)
    except (httpx.HTTPError, ProbeFailure):
        if cutoff.cancelled:
            raise ProbeFailure("the probe was stopped") from None
        return None


def _context(client: httpx.Client, base_url: str, model: str, deadline_s: float, cutoff: Cutoff,
             auth: dict[str, str]) -> int | None:
    props = _json(client, "GET", f"{base_url}/props", deadline_s, cutoff, auth)
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if isinstance(settings, dict) and isinstance(settings.get("n_ctx"), int) and settings["n_ctx"] > 0:
        return settings["n_ctx"]
    models = _json(client, "GET", f"{base_url}/v1/models", deadline_s, cutoff, auth)
    for m in (models.get("data") if isinstance(models, dict) else None) or []:
        if isinstance(m, dict) and m.get("id") == model and isinstance(m.get("max_model_len"), int):
            return m["max_model_len"]
    return None


def _tokens(client: httpx.Client, base_url: str, body: dict[str, Any], deadline_s: float, cutoff: Cutoff,
            auth: dict[str, str]) -> int | None:
    answer = _json(client, "POST", f"{base_url}/tokenize", deadline_s, cutoff, auth, body)
    if not isinstance(answer, dict):
        return None
    if isinstance(answer.get("count"), int):
        return answer["count"] or None
    return len(answer["tokens"]) or None if isinstance(answer.get("tokens"), list) else None


def _chat_tokens(client: httpx.Client, base_url: str, model: str, text: str, deadline_s: float, cutoff: Cutoff,
                 auth: dict[str, str]) -> int | None:
    """The tokens of `text` sent as the probe sends it: one user message through the chat template."""
    messages = [{"role": "user", "content": text}]
    templated = _json(client, "POST", f"{base_url}/apply-template", deadline_s, cutoff, auth, {"messages": messages})
    if isinstance(templated, dict) and isinstance(templated.get("prompt"), str):
        return _tokens(client, base_url, {"content": templated["prompt"], "add_special": True}, deadline_s, cutoff,
                       auth)
    return _tokens(client, base_url, {"model": model, "messages": messages}, deadline_s, cutoff, auth)


def size(client: httpx.Client, base_url: str, model: str, sample: str, deadline_s: float, cutoff: Cutoff,
         auth: dict[str, str] | None = None) -> Size:
    """Ask the server for its slot's context and for the tokens of `sample` (probe words), bare and as a chat;
    what it does not answer stays None (words then count as tokens). Raises ProbeFailure only when the probe
    was stopped."""
    auth = auth or {}
    context = _context(client, base_url, model, deadline_s, cutoff, auth)
    body = {"model": model, "prompt": sample, "content": sample, "add_special_tokens": False}
    bare = _tokens(client, base_url, body, deadline_s, cutoff, auth)
    chat = _chat_tokens(client, base_url, model, sample, deadline_s, cutoff, auth) if bare else None
    words = len(sample.split())
    return Size(bare / words if bare and words else None, max(0, chat - bare) if chat and bare else None, context)
