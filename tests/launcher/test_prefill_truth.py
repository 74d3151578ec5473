"""Issue 43 item 1: what llama-server's counters say about prefill, against the requests' own `timings`
under 1, 4 and 8 concurrent requests on `-np 4` (a real llama-server on the tiny generated model).

`prompt_seconds_total` grows by the wall time of each run of prompt batches once, however many requests'
prompts share it, and the server counts no requests: no per-request prefill can be read from it (the old
"mean prefill/request" read 58-71% low at four streams). What it does measure is the time the server spent
evaluating prompts: `prefill_busy` times the window is the union of the requests' prefill intervals, each
taken from the request's own answer (it ended `predicted_ms` before the answer came and lasted `prompt_ms`)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from test_attach import read_until
from test_server_truth_attached import attached, outside

WORDS = "time person year way day thing man world life hand part child eye woman place work week case".split()


def load(url: str, streams: int, rounds: int) -> list[tuple[float, float]]:
    """`streams` clients, each sending `rounds` distinct prompts one after another; each request's prefill
    interval (start, end) in wall-clock seconds, from its own timings."""
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        with httpx.Client(trust_env=False, timeout=120) as http:
            for r in range(rounds):
                prompt = f"{i:02d}{r:02d} " + " ".join(WORDS[(i + r) % 7:] + WORDS)
                got = http.post(f"{url}/completion", json={"prompt": prompt, "n_predict": 4, "cache_prompt": False})
                t_end = time.time()
                assert got.status_code == 200, got.text
                timings = got.json()["timings"]
                end = t_end - timings["predicted_ms"] / 1000
                with lock:
                    spans.append((end - timings["prompt_ms"] / 1000, end))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spans) == streams * rounds
    return spans


def union(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@pytest.mark.llama
@pytest.mark.parametrize("streams", [1, 4, 8])
def test_prefill_busy_is_the_time_the_requests_spent_in_prefill(llama_server, prefill_model, events, tmp_path,
                                                                 streams) -> None:
    for srv in outside(llama_server, prefill_model, "-c", "4096", "-np", "4"):
        sup, source = attached(srv.url, tmp_path, events)
        try:
            first = read_until(source, "ext", lambda s: s.state == "ready")
            spans = load(srv.url, streams, max(2, 12 // streams))
            done = time.time()
            st = read_until(source, "ext", lambda s: s.ts > done + 0.3 and s.prefill_busy is not None)
        finally:
            source.close()
        assert st.ts - first.ts < 60.0  # the figure's window reaches back to the first read
        busy_s = st.prefill_busy * (st.ts - first.ts)
        truth = union(spans)
        assert busy_s == pytest.approx(truth, rel=0.10), (busy_s, truth, sum(e - s for s, e in spans))
        # one request's prefill cannot be read from these counters: none is shown
        assert st.prefill_mean_s is None
