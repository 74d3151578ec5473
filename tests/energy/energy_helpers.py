"""What the energy tests share: a steady generation load on a llama-server."""

from __future__ import annotations

import threading

import httpx


def keep_generating(url: str, stop: threading.Event, n_predict: int = 16) -> threading.Thread:
    """A daemon thread that sends completions of `n_predict` tokens to the llama-server at `url`, one after
    another, until `stop` (or until the server goes away at teardown)."""

    def load() -> None:
        with httpx.Client(trust_env=False, timeout=30) as c:
            while not stop.is_set():
                try:
                    c.post(f"{url}/completion", json={"prompt": "go", "n_predict": n_predict, "ignore_eos": True})
                except httpx.HTTPError:
                    return

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    return thread
