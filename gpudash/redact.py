"""Secrets never reach the disk: values of secret-looking environment variables and flags are masked.

A server's `env` (HF_TOKEN, OPENAI_API_KEY, DB_PASS) and `extra_args` (--api-key VALUE, --hf-token=VALUE)
are what the operator hands gpudash to pass on; the process gets them unchanged, but every copy gpudash
writes down (the session's config, the server.start events, exports, the server log's command line)
holds a mask. A name is secret-looking when any of its parts (split at -, _ and .) contains KEY, TOKEN,
SECRET, PASS, AUTH or CREDENTIAL, in any case (DB_PASS, apiKey, --x-auth-header, --ssl-keyfile), except
the parts that count or split tokens (--max-num-batched-tokens, --tokenizer): masking too much loses a
number in a copy, masking too little leaks a credential.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MASK = "***"
SECRET_WORDS = ("key", "token", "secret", "pass", "auth", "credential")
# Parts that hold a word above but name token counts or the tokenizer, never a credential.
_COUNTING = frozenset({"tokens", "tokenizer", "tokenizers", "tokenize"})


def secret_name(name: str) -> bool:
    """Whether an env variable or flag name (leading dashes ignored) looks like it holds a secret."""
    parts = re.split(r"[-_.]+", name.lstrip("-").lower())
    return any(word in part for part in parts if part not in _COUNTING for word in SECRET_WORDS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: MASK if secret_name(k) else v for k, v in env.items()}


def redact_args(args: Sequence[str]) -> list[str]:
    """A command line with the value of every secret-looking flag masked (`--flag VALUE` and `--flag=VALUE`)."""
    out: list[str] = []
    mask_next = False
    for a in args:
        if mask_next and not a.startswith("-"):  # a flag after a secret-named flag: it was a switch
            out.append(MASK)
            mask_next = False
        elif a.startswith("-") and "=" in a and secret_name(a.split("=", 1)[0]):
            out.append(a.split("=", 1)[0] + "=" + MASK)
            mask_next = False
        else:
            out.append(a)
            mask_next = a.startswith("-") and secret_name(a)
    return out


def redact_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A server spec as a dict (model_dump) with its env and extra_args masked."""
    out = dict(spec)
    if isinstance(out.get("env"), Mapping):
        out["env"] = redact_env(out["env"])
    if isinstance(out.get("extra_args"), Sequence) and not isinstance(out.get("extra_args"), str):
        out["extra_args"] = redact_args([str(a) for a in out["extra_args"]])
    return out


def redact_config_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """A dumped Config (model_dump) with every server's env and extra_args masked."""
    out = dict(data)
    if isinstance(out.get("servers"), list):
        out["servers"] = [redact_spec(s) if isinstance(s, Mapping) else s for s in out["servers"]]
    return out


def secret_values(env: Mapping[str, str], args: Sequence[str]) -> tuple[str, ...]:
    """The values `redact_env` and `redact_args` mask, longest first, for masking them in free text (a
    server that prints its own arguments into its log, as vLLM does). Values under 4 characters are left
    alone: masking every "1" in a log would hide more than it protects."""
    values = {v for k, v in env.items() if secret_name(k)}
    for given, shown in zip(args, redact_args(args)):
        if given != shown:
            values.add(given.split("=", 1)[1] if shown.endswith("=" + MASK) else given)
    return tuple(sorted((v for v in values if len(v) >= 4), key=len, reverse=True))


def mask_values(text: str, values: Sequence[str]) -> str:
    for v in values:
        text = text.replace(v, MASK)
    return text
