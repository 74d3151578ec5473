"""A CUDA llama-server with and without the transfer engine inside it (libgpudash_preload.so).

One run each way of the same script: start llama-server on a generated 8B-shape f16 model with
`-ngl 999 -c 40000 -np 1 --cache-ram 16384 -fa on` (ready time), then four requests with a 16k-token
prompt: A new (miss), A again (in-slot hit), B (a miss that displaces A: the slot's state is saved to
host memory, D2H), A again (restored from the host cache: H2D, and B saved). For each: TTFT, the prompt
tokens the server evaluated, and, for the preloaded run, what its stats block counted meanwhile per
direction: copies taken and passed through, bytes, wall time inside the intercepted copy calls and
until the bytes had landed. The run without the preload is measured the same way by a counting
LD_PRELOAD that changes nothing (benchmarks/native/copy_counter.c, built here with cc): wall time inside
cudart's copy calls per direction. "The rest" is ready time or TTFT minus the time inside copy calls:
the server's own work. The tokens generated at temperature 0 must be the same in both runs.

The model is written once to --model-dir (f16 matrices that are views of one random buffer, streamed
to disk: seconds, not minutes) and reused while its shape is unchanged; it is read once before the runs
so both load it from the page cache.

Run: python benchmarks/bench_preload_llama.py --llama-server /path/to/llama-server [--layers 32 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gpudash.engine.errors import EngineError
from gpudash.preload.shm import SHM_DIR, StatsView, preload_env
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_f16_model

STEPS = ("A new (miss)", "A again (in-slot hit)", "B (miss, saves A to host)", "A again (host-cache restore)")
READY_TIMEOUT_S = 300
COUNTER_SOURCE = Path(__file__).resolve().parent / "native" / "copy_counter.c"


def _model(args: argparse.Namespace) -> Path:
    shape = DemoModelShape(layers=args.layers, embedding=args.embedding, heads=args.heads, heads_kv=args.heads_kv,
                           feed_forward=args.feed_forward, context=args.ctx)
    path = Path(args.model_dir) / (f"gpudash-bench-l{shape.layers}-e{shape.embedding}-h{shape.heads}-"
                                   f"kv{shape.heads_kv}-ff{shape.feed_forward}-c{shape.context}-f16.gguf")
    if not path.exists():
        t0 = time.perf_counter()
        write_f16_model(path, shape)
        print(f"wrote {path} ({path.stat().st_size / 1e9:.1f} GB) in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


def _warm(path: Path) -> None:
    """Read the model once, so both runs load it from the page cache (a cold first run would be unfair)."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        while f.readinto(buf):
            pass


def _prompt(seed: int, tokens: int) -> str:
    """`tokens` tokens of text for the model's byte vocabulary (one token a byte), distinct per seed
    from the first byte on, so B shares no prefix with A."""
    rng = random.Random(seed)
    head = f"{seed:04d}-"  # no spaces: SentencePiece would make each one three byte tokens
    return head + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(tokens - len(head) - 1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _counter_library(model_dir: Path) -> Path:
    """benchmarks/native/copy_counter.c built with the system compiler (the baseline's measuring tool)."""
    out = model_dir / "libgpudash_copy_counter.so"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(COUNTER_SOURCE), "-ldl"], check=True)
    return out


def _snap(pid: int, preload: bool) -> dict[str, dict[str, float]] | None:
    """Totals so far per direction: copy calls, bytes and seconds inside them (plus, with the preload,
    copies passed through and seconds until the bytes had landed)."""
    if not preload:
        try:
            raw = (SHM_DIR / f"gpudash-copy-counter-{pid}").read_bytes()
        except OSError:
            return None
        calls = struct.unpack_from("=9Q", raw)
        return {d: {"calls": calls[3 * i], "passed": 0, "bytes": calls[3 * i + 1], "in_calls": calls[3 * i + 2] / 1e9,
                    "landed": None} for i, d in enumerate(("h2d", "d2h", "other"))}
    try:
        with StatsView(pid) as view:
            s = view.read_after(time.time())  # a publish from after the step, not up to 100 ms before
    except EngineError:
        return None
    return {d: {"calls": x.copies_taken, "passed": x.copies_passed, "bytes": x.bytes_taken,
                "in_calls": x.ns_in_calls_taken / 1e9, "landed": x.ns_to_landed_taken / 1e9}
            for d, x in (("h2d", s.h2d), ("d2h", s.d2h))}


def _delta(after: dict | None, before: dict | None) -> dict[str, dict[str, float | None]]:
    if after is None:
        return {}
    out = {}
    for d, x in after.items():
        b = (before or {}).get(d, {})
        out[d] = {k: None if v is None else v - (b.get(k) or 0) for k, v in x.items()}
    return out


def _request(url: str, prompt: str, n_predict: int) -> dict[str, Any]:
    """One streamed completion on a connection of its own (the server may close an idle kept-alive one)."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": True, "stream": True,
            "return_tokens": True, "seed": 0}
    t0 = time.perf_counter()
    ttft = None
    tokens: list[int] = []
    timings: dict[str, Any] = {}
    with httpx.Client(trust_env=False) as client, \
            client.stream("POST", f"{url}/completion", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[len("data: "):])
            if ttft is None and (chunk.get("tokens") or chunk.get("content")):
                ttft = time.perf_counter() - t0
            tokens += chunk.get("tokens") or []
            timings = chunk.get("timings") or timings
    return {"ttft_s": ttft, "tokens": tokens, "prompt_n": timings.get("prompt_n"),
            "cache_n": timings.get("cache_n"), "prompt_ms": timings.get("prompt_ms")}


def one_run(args: argparse.Namespace, model: Path, preload: bool, counter: Path) -> dict[str, Any]:
    """Start the server (with the preload, or with only the copy counter), time it to ready, send the four
    requests, stop it."""
    port = _free_port()
    argv = [args.llama_server, "-m", str(model), "-ngl", "999", "-c", str(args.ctx), "-np", "1",
            "--cache-ram", str(args.cache_ram), "-fa", "on", "--host", "127.0.0.1", "--port", str(port)]
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    knobs = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.knob)}
    env = preload_env(base, "bench-llama", knobs) if preload else {**base, "LD_PRELOAD": str(counter)}
    log = open(Path(args.model_dir) / f"bench-llama-{'preload' if preload else 'native'}.log", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"steps": []}
    try:
        with httpx.Client(trust_env=False) as client:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"llama-server exited with {proc.returncode} before it was ready; see {log.name}")
                try:
                    if client.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.perf_counter() - t0 > READY_TIMEOUT_S:
                    raise SystemExit(f"llama-server not ready after {READY_TIMEOUT_S} s; see {log.name}")
                time.sleep(0.02)
            out["ready_s"] = time.perf_counter() - t0
            before = _snap(proc.pid, preload)
            out["load"] = _delta(before, None)
            a, b = _prompt(1, args.prompt_tokens), _prompt(2, args.prompt_tokens)
            for prompt in (a, a, b, a):
                r = _request(url, prompt, args.n_predict)
                after = _snap(proc.pid, preload)
                r["copies"] = _delta(after, before)
                before = after
                out["steps"].append(r)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return out


def _secs(c: dict[str, Any], d: str, key: str) -> float | None:
    return (c.get(d) or {}).get(key)


def _cell(v: float | None, width: int = 9, fmt: str = ".3f") -> str:
    return f"{'—':>{width}}" if v is None else f"{v:>{width}{fmt}}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{'—':>7}" if a is None or not b else f"{a / b:>6.2f}x"


def report(native: dict[str, Any], pre: dict[str, Any]) -> bool:
    """The side-by-side table; True when the tokens matched."""
    names = ["ready (model load)", *STEPS]
    ends = [native["ready_s"] * 1e3, *(s["ttft_s"] * 1e3 for s in native["steps"])]
    ends_p = [pre["ready_s"] * 1e3, *(s["ttft_s"] * 1e3 for s in pre["steps"])]
    copies_n = [native.get("load", {}), *(s["copies"] for s in native["steps"])]
    copies_p = [pre.get("load", {}), *(s["copies"] for s in pre["steps"])]
    print(f"{'':<31}{'ready/TTFT ms':^27}|{'H2D s inside copy calls':^27}|{'D2H s inside copy calls':^27}|"
          f"{'the rest, ms':^20}")
    print(f"{'':<31}" + f"{'without':>10}{'with':>10}{'ratio':>7}|" * 3 + f"{'without':>10}{'with':>10}")
    for name, a, b, cn, cp in zip(names, ends, ends_p, copies_n, copies_p):
        cells = f"{a:>10.1f}{b:>10.1f}{_ratio(a, b)}|"
        for d in ("h2d", "d2h"):
            x, y = _secs(cn, d, "in_calls"), _secs(cp, d, "in_calls")
            cells += f"{_cell(x, 10)}{_cell(y, 10)}{_ratio(x, y)}|"
        for total, c in ((a, cn), (b, cp)):  # ready/TTFT outside the copy calls: the server's own work
            inside = [_secs(c, d, "in_calls") for d in ("h2d", "d2h")]
            cells += _cell(None if None in inside else total - 1e3 * sum(inside), 10, ".1f")
        print(f"{name:<31}{cells}")
    print()
    print("copies per step, H2D and D2H: calls (without) | taken/passed, GB, s until landed (with the preload)")
    for name, cn, cp in zip(names, copies_n, copies_p):
        parts = []
        for d in ("h2d", "d2h"):
            x, y = cn.get(d) or {}, cp.get(d) or {}
            parts.append(f"{d} {x.get('calls', '—')} | {y.get('calls', '—')}/{y.get('passed', '—')}, "
                         f"{(y.get('bytes') or 0) / 1e9:.2f} GB, {_cell(y.get('landed'), 0)} s")
        other = (cn.get("other") or {}).get("calls")
        print(f"  {name:<29}" + "; ".join(parts) + (f"; other kinds {other}" if other else ""))
    print("prompt tokens evaluated (without / with): " + ", ".join(
        f"{n['prompt_n']}/{p['prompt_n']}" for n, p in zip(native["steps"], pre["steps"])))
    print("the preloaded run counts time inside the copies the engine took; copies it passed through "
          "are counted, not timed")
    same = [n["tokens"] == p["tokens"] and bool(n["tokens"]) for n, p in zip(native["steps"], pre["steps"])]
    print("tokens at temperature 0 equal with and without the preload: " +
          ", ".join(f"{name}: {'yes' if s else 'NO'}" for name, s in zip(STEPS, same)))
    if not pre.get("load"):
        print("the preloaded server published no stats block: was libgpudash_preload.so loaded (see its log)?")
    return all(same)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="a CUDA build of llama-server")
    ap.add_argument("--model-dir", default="/tmp", help="where the generated model and the server logs go")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--embedding", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--feed-forward", type=int, default=14336)
    ap.add_argument("--ctx", type=int, default=40000, help="-c, and the model's trained context")
    ap.add_argument("--cache-ram", type=int, default=16384, help="--cache-ram in MiB")
    ap.add_argument("--prompt-tokens", type=int, default=16000)
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="start-up knob of the preloaded engine (integers; repeatable)")
    args = ap.parse_args()
    model = _model(args)
    _warm(model)
    counter = _counter_library(Path(args.model_dir))
    native = one_run(args, model, preload=False, counter=counter)
    pre = one_run(args, model, preload=True, counter=counter)
    return 0 if report(native, pre) else 1


if __name__ == "__main__":
    sys.exit(main())
