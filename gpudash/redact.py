"""Secrets never reach the disk or a screen: values of secret-looking environment variables and flags
are masked, and so is every known secret value, and a URL's credentials, wherever they appear in text.

A server's `env` (HF_TOKEN, OPENAI_API_KEY, DB_PASS) and `extra_args` (--api-key VALUE, --hf-token=VALUE)
are what the operator hands gpudash to pass on; the process gets them unchanged, but every copy gpudash
writes down (the session's config, the server.start events, exports, the server log's command line)
holds a mask. A name is secret-looking when any of its parts (split at -, _ and .) contains KEY, TOKEN,
SECRET, PASS, AUTH or CREDENTIAL, in any case (DB_PASS, apiKey, --x-auth-header, --ssl-keyfile), except
the parts that count or split tokens (--max-num-batched-tokens, --tokenizer): masking too much loses a
number in a copy, masking too little leaks a credential.

Free text (a server's error body that echoes the API key, a URL with `user:password@`) is masked by
`mask_text`: the secrets of every config this process loaded are remembered (`remember_config`), and the
store, the exports and the terminal (outside.py) mask them and any URL's credentials.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
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


# A URL's userinfo: `scheme://user:password@` keeps the user, a lone `scheme://token@` is all secret; and
# an address without its scheme (`user:password@host`, as an HTTP client names its server).
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/?#@:]*)(:[^\s/@]*)?@")
_ADDRESS_USERINFO = re.compile(r"""(?<![^\s'"(<=,])([^\s/?#@:'"(<=,]+):[^\s/@'"]*@(?=[\w\[])""")
_known: tuple[str, ...] = ()  # secret values seen in configs, longest first (replaced whole: readers need no lock)
_known_lock = threading.Lock()


def _userinfo_masked(m: re.Match[str]) -> str:
    return f"{m[1]}{m[2]}:{MASK}@" if m[3] is not None else f"{m[1]}{MASK}@"


def mask_url_credentials(text: str) -> str:
    """`text` with the credentials of every URL in it masked: http://alice:***@host, http://***@host,
    alice:***@host."""
    if "@" not in text:
        return text
    return _ADDRESS_USERINFO.sub(rf"\1:{MASK}@", _URL_USERINFO.sub(_userinfo_masked, text))


def remember(values: Iterable[str | None]) -> None:
    """Keep secret values for `mask_text`, as given and as they show up in error text: stripped (a key
    read with its trailing newline) and escaped (`b'Bearer sk-1\\n'`, as httpx words a bad header)."""
    global _known
    forms = set()
    for v in values:
        if v:
            forms.update((v, v.strip(), v.encode("unicode_escape").decode("ascii")))
    with _known_lock:
        _known = tuple(sorted(set(_known) | {f for f in forms if len(f) >= 4}, key=len, reverse=True))


def config_secrets(config: Any) -> tuple[str, ...]:
    """The secret values a config hands on: each server's secret env values and flags, and the API key
    its `api_key_env` names (read from this process's environment)."""
    out: list[str] = []
    for spec in getattr(config, "servers", ()):
        out += secret_values(spec.env or {}, [str(a) for a in spec.extra_args or ()])
        if spec.api_key_env and os.environ.get(spec.api_key_env):
            out.append(os.environ[spec.api_key_env])
    return tuple(out)


def remember_config(config: Any) -> None:
    """Remember the secrets of a config this process runs with (`config_secrets`), for `mask_text`."""
    remember(config_secrets(config))


def mask_data(value: Any) -> Any:
    """`value` (what becomes JSON: dicts, lists, scalars) with `mask_text` applied to every string in it, so
    masking never breaks the JSON's syntax (a secret such as "true" is masked as a value, not as a word)."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {k: mask_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_data(v) for v in value]
    return value


def mask_text(text: str) -> str:
    """`text` with every remembered secret value and every URL's credentials masked."""
    if _known:
        text = mask_values(text, _known)
    return mask_url_credentials(text) if "@" in text else text  # the test inline: most texts hold no "@"
