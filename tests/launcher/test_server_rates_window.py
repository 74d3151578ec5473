"""Issue 43 items 2, 3 and 5 on llama-server's own answers (the shapes tools/server/server-context.cpp gives
its /slots and server-task.cpp its /metrics): prompt tokens counted once when a generating slot's step flushes
another slot's half-evaluated prompt into `prompt_tokens_total`, token rates over a window that spans several
of the server's once-per-batch updates (not 0, 0, 1864, 0), and a prefix-cache hit rate over the last minute
rather than since the server started."""

from __future__ import annotations

import json

import pytest

from gpudash.launcher.counters import RATE_WINDOW_S, History, Prev
from gpudash.launcher.kinds.llama_cpp import PROMPT_PROGRESS, LlamaCpp


def slot(i: int, task: int | None, *, prefill: int = 0, decoded: int = 0, busy: bool = False) -> dict:
    """One slot of /slots as llama-server answers it (only the fields gpudash reads)."""
    out = {"id": i, "n_ctx": 4096, "is_processing": busy}
    if task is not None:
        out.update(id_task=task, n_prompt_tokens=prefill + decoded, n_prompt_tokens_processed=prefill,
                   next_token=[{"n_decoded": decoded}])
    return out


def metrics(prompt: float, predicted: float = 0.0, cached: float = 0.0, prompt_s: float = 0.0) -> str:
    return "\n".join(f"# TYPE llamacpp:{n} counter\nllamacpp:{n} {v}" for n, v in (
        ("prompt_tokens_total", prompt), ("prompt_tokens_cached_total", cached), ("prompt_seconds_total", prompt_s),
        ("tokens_predicted_total", predicted), ("tokens_predicted_seconds_total", 0.0))) + "\n"


class Server:
    """Feeds LlamaCpp.scrape one (metrics, slots) answer per tick, as ServerSource does."""

    def __init__(self) -> None:
        self.history = History()

    def read(self, now: float, text: str, slots: list[dict]) -> dict:
        answers = {"/metrics": text.encode(), "/slots": json.dumps(slots).encode()}
        fields, values = LlamaCpp().scrape(lambda path: (200, answers[path]), None, self.history, 7, now)
        self.history.add(Prev(7, now, values))
        return {**fields, "progress": values[PROMPT_PROGRESS]}


def test_a_prompt_flushed_by_another_slots_step_is_counted_once() -> None:
    """Slot 0 evaluated 2048 of its prompt; slot 1's 452-token prompt finished and its step flushed both into
    the counter (2500) while slot 0 still shows its 2048 as in flight. Counter plus slots said 4548."""
    srv = Server()
    srv.read(0.0, metrics(0), [slot(0, None), slot(1, None)])
    assert srv.read(1.0, metrics(0), [slot(0, 5, prefill=2048, busy=True), slot(1, None)])["progress"] == 2048
    got = srv.read(2.0, metrics(2500), [slot(0, 5, prefill=2048, busy=True), slot(1, 6, prefill=452, decoded=1,
                                                                                  busy=True)])
    assert got["progress"] == 2500
    done = srv.read(3.0, metrics(2500 + 1000), [slot(0, 5, prefill=3048, decoded=1, busy=True), slot(1, None)])
    assert done["progress"] == 3500


def test_a_steady_prefill_reads_steadily_over_the_window() -> None:
    """A prefill of 682 tok/s that the server advances once per 2048-token batch (every 3 s), read every
    second: the per-tick rate was 0, 0, 2048; over RATE_WINDOW_S it is within a batch of the truth, never 0,
    and the window it covers is in the sample."""
    srv = Server()
    rates = []
    for t in range(40):
        done = 2048 * (t // 3)
        got = srv.read(float(t), metrics(0), [slot(0, 9, prefill=done, busy=True)])
        if t > RATE_WINDOW_S:
            rates.append(got["prompt_tokens_per_s"])
            assert got["rate_window_s"] == pytest.approx(RATE_WINDOW_S)
    assert min(rates) > 0.7 * 2048 / 3 and max(rates) < 1.3 * 2048 / 3, rates


def test_the_prefix_cache_hit_rate_is_over_the_last_minute() -> None:
    """80 of 100 cached in the first minutes, then a minute of 99 of 100: the last minute's rate is 0.99,
    where since-start it reads about 0.83."""
    srv = Server()
    got = {}
    for t in range(0, 200, 2):
        hits, misses = (80 * t, 20 * t) if t <= 120 else (80 * 120 + 99 * (t - 120), 20 * 120 + (t - 120))
        got = srv.read(float(t), metrics(misses, cached=hits), [slot(0, None)])
    assert got["prefix_cache_hit_rate"] == pytest.approx(0.99, abs=0.001)
    assert got["prefix_cache_hits"] / got["prefix_cache_queries"] < 0.9


def test_the_counts_behind_the_rates_are_in_the_sample() -> None:
    """A windowed rate times one tick smears a tick's tokens over RATE_WINDOW_S (energy per token integrated
    rate x tick from it): the sample carries the counts themselves, whose change is a tick's tokens exactly."""
    srv = Server()
    srv.read(0.0, metrics(100, predicted=40), [slot(0, None)])
    got = srv.read(1.0, metrics(100, predicted=40), [slot(0, 3, prefill=50, decoded=7, busy=True)])
    assert (got["generation_tokens_total"], got["prompt_tokens_total"]) == (47, 100)  # decoding: its prompt is in the counter
    got = srv.read(2.0, metrics(150, predicted=40), [slot(0, 3, prefill=50, decoded=12, busy=True)])
    assert (got["generation_tokens_total"], got["prompt_tokens_total"]) == (52, 150)
