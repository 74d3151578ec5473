"""vLLM sleep mode over HTTP: put a server's engine to sleep, wake it, ask whether it sleeps, timed.

vLLM serves POST /sleep?level=N, POST /wake_up and GET /is_sleeping only when it runs with
`--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1` (the launcher sets both from `enable_sleep_mode`).
Level 0 only pauses scheduling (vLLM pull request 33195, in 0.33), level 1 moves the weights to host
memory and drops the KV cache, level 2 drops both. The time a call
takes is the model-switching cost the transfer engine is meant to cut, so every call is timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import httpx

# Waking a large model copies every weight back to the GPU: allow minutes.
SLEEP_TIMEOUT_S = 600.0

Action = Literal["sleep", "wake"]


class SleepError(Exception):
    """A sleep or wake the server did not carry out; the message says why and how to fix it."""


@dataclass(frozen=True)
class SleepResult:
    action: Action
    seconds: float
    level: int | None  # the sleep level (None for a wake)
    sleeping: bool | None  # /is_sleeping afterwards (None when it did not answer)


def is_sleeping(base_url: str, timeout_s: float = 5.0) -> bool | None:
    """GET /is_sleeping; None when the server does not serve it (no dev mode) or does not answer."""
    try:
        r = httpx.get(f"{base_url}/is_sleeping", timeout=timeout_s, trust_env=False)
        return bool(r.json()["is_sleeping"]) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def sleep_or_wake(base_url: str, action: Action, level: int = 1, timeout_s: float = SLEEP_TIMEOUT_S) -> SleepResult:
    """POST /sleep?level=LEVEL or /wake_up and time it; SleepError when the server refuses or is unreachable."""
    if action == "sleep" and level not in (0, 1, 2):
        raise SleepError(f"sleep level {level} is not 0 (scheduling paused), 1 (weights to host memory) or 2 "
                         "(weights dropped)")
    path, params = ("/sleep", {"level": str(level)}) if action == "sleep" else ("/wake_up", {})
    t0 = time.perf_counter()
    try:
        r = httpx.post(f"{base_url}{path}", params=params, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as err:
        raise SleepError(f"{action} failed: {base_url} did not answer {path} ({type(err).__name__}); "
                         "is the server running?") from None
    seconds = time.perf_counter() - t0
    if r.status_code == 404:
        raise SleepError(f"{base_url} does not serve {path}: vLLM serves it only with --enable-sleep-mode and "
                         "VLLM_SERVER_DEV_MODE=1; set enable_sleep_mode = true in its [[servers]] entry")
    if r.status_code != 200:
        raise SleepError(f"{action} failed: {path} answered HTTP {r.status_code}: {r.text.strip()[:200]}")
    return SleepResult(action, seconds, level if action == "sleep" else None, is_sleeping(base_url))
