"""The cost of reading one /metrics answer of 150 000 series (issue 37 item 16): an attached server whose
/metrics carries another exporter's series beside its own (5 MB, under the 8 MiB cap). "this" parses
only the families the kind reads (one regular-expression scan picks their lines); "baseline" is the parse
of every series that gpudash did before (prometheus_client's parser over the whole text). At a 1 s
refresh the per-read milliseconds are tenths of a percent of a core. Medians of several runs.

Run: PYTHONPATH=. python benchmarks/bench_scrape_parse.py [--runs 5] [--series 150000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpudash.launcher.counters import parse_metrics
from gpudash.launcher.kinds.llama_cpp import LlamaCpp

OWN = ("# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 300\n"
       "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 40\n")


def body(series: int) -> str:
    return OWN + "# TYPE other_series gauge\n" + "".join(f'other_series{{id="{i:07d}"}} {i}\n' for i in range(series))


def timed(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--series", type=int, default=150_000)
    args = ap.parse_args()
    text = body(args.series)
    this = timed(lambda: parse_metrics(text, LlamaCpp.metric_families), args.runs)
    base = timed(lambda: parse_metrics(text), args.runs)
    print(f"one /metrics answer: {args.series} series, {len(text) / 1e6:.1f} MB; CPU ms per read, median of {args.runs}")
    print(f"{'':22} {'ms/read':>9} {'% core at 1 Hz':>15}")
    print(f"{'baseline (all parsed)':22} {base:9.1f} {base / 10:15.1f}")
    print(f"{'this (families read)':22} {this:9.1f} {this / 10:15.1f}")
    print(f"baseline / this: {base / this:.0f}x")


if __name__ == "__main__":
    main()
