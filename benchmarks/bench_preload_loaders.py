"""The loaders people use, with and without the transfer engine inside the process (libgpudash_preload.so).

Cases, each timed in a fresh process (CUDA initialised and one warm-up copy made first, so the engine
runs), without and with the preload in turn, `--rounds` times; the table gives medians, GB/s of file or
state-dict bytes, and the process's CPU per GB (core-seconds: user + system, the whole process):
  load_file       safetensors `load_file(path, device="cuda")` of an 8B-llama-shaped bf16 file (in the
                  page cache: it is read once before the rounds)
  load_file_warm  load_file after PyTorch's pinned-memory cache already holds a block for every tensor (made
                  and freed before the clock starts): the most a pool serving `torch.empty(pin_memory=True)`
                  could save
  safe_open       `safe_open(path, "pt", device="cpu")` and `get_tensor(k).to("cuda")` for every tensor
  vllm            vLLM's default loader: the parameters allocated on the GPU first, then `safe_open(path,
                  "pt")` and `param.data.copy_(f.get_tensor(k))` for every tensor
  load_file cold  load_file after the page cache is dropped (root only: /proc/sys/vm/drop_caches)
  state dict      the same shapes as pageable tensors in memory (copied out of the file before the clock
                  starts), `{k: v.to("cuda")}` tensor by tensor
  from_pretrained transformers `from_pretrained(dir, device_map="cuda", dtype=bfloat16)` of a Llama model
                  made here (random init, `save_pretrained` as safetensors)
  idle            no copies: the process's CPU over 5 s of sleep after its warm-up copy (the engine's
                  threads idle, the stats publisher running)
Every tensor is checked byte for byte on the GPU: the file's and the state dict's contents are a pattern
regenerated on the GPU; from_pretrained's parameters are fingerprinted and compared between the runs.

`--trace` runs load_file and safe_open once under GPUDASH_PRELOAD_TRACE=1 and prints, per intercepted
copy kind, what the preload saw (the memory of both sides, the host side's mapping) and decided.
`--breakdown` splits a native load_file-like loop into its steps (pinned allocation, the copy out of the
file's mapping, the H2D copy), and times the file copy with 1 and with 16 threads.

`--also NAME:k=v,...` adds a preloaded configuration that takes its turn in every round beside the plain
preloaded one (a lower-case k is a start-up knob, an upper-case K an environment variable, such as
GPUDASH_ENGINE_LIB for another build of the engine); the table then has a row per case and configuration,
each against the same native runs.

Run: python benchmarks/bench_preload_loaders.py --dir /path/with/15GB [--layers 12] [--rounds 3]
     [--cases load_file,load_file_warm,safe_open,vllm,state_dict,from_pretrained,cold,idle] [--trace]
     [--breakdown] [--knob name=value ...] [--env NAME=VALUE ...] (start-up knobs and environment of the
     preloaded runs) [--also NAME:k=v,... ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GB = 1e9
HIDDEN, KV, FF, VOCAB = 4096, 1024, 14336, 128256  # Llama 3 8B


def shapes(layers: int) -> dict[str, tuple[int, ...]]:
    """An 8B-llama state dict's names and shapes with `layers` layers (bf16)."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": (KV, HIDDEN),
                p + "self_attn.v_proj.weight": (KV, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                p + "mlp.gate_proj.weight": (FF, HIDDEN), p + "mlp.up_proj.weight": (FF, HIDDEN),
                p + "mlp.down_proj.weight": (HIDDEN, FF), p + "input_layernorm.weight": (HIDDEN,),
                p + "post_attention_layernorm.weight": (HIDDEN,)}
    return out | {"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}


def pattern(i: int, shape: tuple[int, ...], device: str) -> Any:
    """Tensor i's contents: 16-bit words (i * 40503 + index * 2654435761) mod 2**16, as bf16 bits."""
    import torch

    n = 1
    for s in shape:
        n *= s
    w = (torch.arange(n, dtype=torch.int64, device=device) * 2654435761 + i * 40503) & 0xFFFF
    return (w - 0x10000 * (w >= 0x8000)).to(torch.int16).view(torch.bfloat16).reshape(shape)


def exact(tensors: dict[str, Any], layers: int) -> bool:
    """Every tensor equals its pattern, bit for bit (compared on the GPU)."""
    import torch

    return all(torch.equal(tensors[k].view(torch.int16), pattern(i, s, "cuda").view(torch.int16))
               for i, (k, s) in enumerate(shapes(layers).items()))


def make_file(path: Path, layers: int) -> None:
    """The safetensors file of `shapes(layers)`, patterns made on the GPU, written once."""
    import torch
    from safetensors.torch import save_file

    if path.exists():
        return
    sd = {k: pattern(i, s, "cuda").cpu() for i, (k, s) in enumerate(shapes(layers).items())}
    tmp = path.with_suffix(".tmp")
    save_file(sd, str(tmp))
    tmp.rename(path)
    del sd
    torch.cuda.empty_cache()


def make_model(d: Path, layers: int) -> None:
    """A Llama model of `layers` layers at 8B width, random init on the GPU, saved as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (d / "config.json").exists():
        return
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=layers, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=VOCAB, tie_word_embeddings=False)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(d), max_shard_size="50GB")
    del model
    torch.cuda.empty_cache()


def read_through(paths: list[Path]) -> None:
    """Reads the files once, so that the timed loads find them in the page cache."""
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


def drop_caches() -> str | None:
    """Drops the page cache (root): None, or why it could not."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return None
    except OSError as err:
        return f"cannot drop the page cache: {err.strerror}"


def fingerprint(model: Any) -> list[int]:
    """Two sums per parameter of its 16-bit words (plain and index-weighted), on the GPU."""
    import torch

    out = []
    for _, p in sorted(model.state_dict().items()):
        w = p.contiguous().view(torch.int16).flatten().to(torch.int64)
        out += [int(w.sum()), int((w * torch.arange(w.numel(), device=w.device) % 1000003).sum())]
    return out


# ---- one case in a fresh process --------------------------------------------------------------------


def prepare(case: str, args: argparse.Namespace, path: Path) -> Any:
    """What a case has ready before the clock starts: the state dict in pageable memory, vLLM's GPU
    parameters, or PyTorch's pinned cache holding a block for every tensor."""
    import torch

    if case == "state_dict":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as f:  # cloned on every core
            return {k: f.get_tensor(k).clone() for k in shapes(args.layers)}
    if case == "vllm":
        return {k: torch.empty(s, dtype=torch.bfloat16, device="cuda") for k, s in shapes(args.layers).items()}
    if case == "load_file_warm":
        blocks = [torch.empty(s, dtype=torch.bfloat16, pin_memory=True) for s in shapes(args.layers).values()]
        del blocks  # back into PyTorch's pinned cache, which load_file's allocations then reuse
    return None


def load(case: str, args: argparse.Namespace, path: Path, ready: Any) -> Any:
    """The timed part of a case."""
    import torch

    if case in ("load_file", "load_file_warm", "cold"):
        from safetensors.torch import load_file

        return load_file(str(path), device="cuda")
    if case == "safe_open":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k).to("cuda") for k in f.keys()}
    if case == "vllm":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                ready[k].data.copy_(f.get_tensor(k))
        return ready
    if case == "state_dict":
        return {k: v.to("cuda") for k, v in ready.items()}
    if case == "idle":
        time.sleep(5.0)
        return {}
    if case == "from_pretrained":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(Path(args.dir) / f"llama-model-l{args.model_layers}"),
                                                    device_map="cuda", dtype=torch.bfloat16)
    raise SystemExit(f"unknown case {case}")


def child(case: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.cuda.init()
    warm = torch.ones(64 << 20, dtype=torch.uint8)
    assert torch.equal(warm.cuda().cpu(), warm)  # starts the preloaded engine
    if os.environ.get("LD_PRELOAD"):
        time.sleep(0.3)
    path = Path(args.dir) / f"llama-l{args.layers}.safetensors"
    ready = prepare(case, args, path)
    torch.cuda.synchronize()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = load(case, args, path, ready)
    torch.cuda.synchronize()
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    res: dict[str, Any] = {"s": t1 - t0, "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)}
    if case == "from_pretrained":
        res["bytes"] = sum(p.numel() * p.element_size() for p in out.state_dict().values())
        res["fingerprint"] = fingerprint(out)
    elif case == "idle":
        res["bytes"], res["exact"] = 0, True
    else:
        res["bytes"] = sum(t.numel() * t.element_size() for t in out.values())
        res["exact"] = exact(out, args.layers)
    if os.environ.get("LD_PRELOAD"):
        from gpudash.preload.shm import StatsView

        with StatsView(os.getpid()) as view:
            st = view.read_after(time.time())
        res["preload"] = st.summary_lines()
    return res


def run_child(case: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", case, "--dir", args.dir, "--layers", str(args.layers),
            "--model-layers", str(args.model_layers)]
    if case == "cold":
        why = drop_caches()
        if why:
            return {"skipped": why}
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{case} failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- --trace and --breakdown ----------------------------------------------------------------------------

TRACE_SCRIPT = """
import sys, torch
from safetensors import safe_open
from safetensors.torch import load_file
torch.cuda.init(); w = torch.ones(64 << 20, dtype=torch.uint8); w.cuda().cpu()
p = sys.argv[1]
print("load_file", file=sys.stderr, flush=True)
t = load_file(p, device="cuda"); torch.cuda.synchronize(); del t
print("safe_open cpu + .to(cuda)", file=sys.stderr, flush=True)
with safe_open(p, framework="pt", device="cpu") as f:
    t = {k: f.get_tensor(k).to("cuda") for k in f.keys()}
torch.cuda.synchronize(); del t
if len(sys.argv) > 2:
    from transformers import AutoModelForCausalLM
    print("from_pretrained", file=sys.stderr, flush=True)
    m = AutoModelForCausalLM.from_pretrained(sys.argv[2], device_map="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
"""


def trace(args: argparse.Namespace, env: dict[str, str]) -> None:
    """What the preload saw and decided for each copy of load_file, safe_open and from_pretrained (when
    its model was made), summarised."""
    path = Path(args.dir) / f"llama-l{args.layers}.safetensors"
    model = Path(args.dir) / f"llama-model-l{args.model_layers}"
    argv = [sys.executable, "-c", TRACE_SCRIPT, str(path), *([str(model)] if model.exists() else [])]
    r = subprocess.run(argv, env={**env, "GPUDASH_PRELOAD_TRACE": "1"}, capture_output=True, text=True)
    print(f"trace (exit {r.returncode}): copies by call, sides, host mapping (address range cut) and decision")
    section, counts, first = "warm-up", collections.Counter(), {}
    for line in r.stderr.splitlines():
        if not line.startswith("gpudash preload: trace "):
            if line in ("load_file", "safe_open cpu + .to(cuda)", "from_pretrained"):
                section = line
            continue
        body = line.removeprefix("gpudash preload: trace ")
        key = re.sub(r" \d+ B ", " <n> B ", re.sub(r"\[[0-9a-f]+-[0-9a-f]+ ", "[", body))
        counts[(section, key)] += 1
        first.setdefault((section, key), body)
    for (sec, key), n in counts.items():
        print(f"  {sec}: {n} x {key}")
        print(f"      first: {first[(sec, key)][:240]}")


BREAKDOWN_SCRIPT = """
import json, sys, time, torch
from safetensors import safe_open
torch.cuda.init(); w = torch.ones(64 << 20, dtype=torch.uint8); w.cuda().cpu()
p, out = sys.argv[1], {}
def step(name, fn):
    torch.cuda.synchronize(); t = time.perf_counter(); r = fn(); torch.cuda.synchronize()
    out[name] = out.get(name, 0.0) + time.perf_counter() - t
    return r
for threads in (1, 16):
    torch.set_num_threads(threads)
    with safe_open(p, framework="pt", device="cpu") as f:
        for k in f.keys():
            src = f.get_tensor(k)
            pin = step("pinned torch.empty", lambda: torch.empty_like(src, pin_memory=True))
            step(f"copy out of the mapping, {threads} thread(s)", lambda: pin.copy_(src))
            step("H2D from pinned (.to)", lambda: pin.to("cuda")) if threads == 1 else None
print(json.dumps(out))
"""


def breakdown(args: argparse.Namespace, env: dict[str, str]) -> None:
    """Where a native load of the file (in the page cache) spends its time, step by step."""
    path = Path(args.dir) / f"llama-l{args.layers}.safetensors"
    size = path.stat().st_size
    r = subprocess.run([sys.executable, "-c", BREAKDOWN_SCRIPT, str(path)], env=env, capture_output=True, text=True)
    if r.returncode:
        print(f"breakdown failed: {r.stderr[-2000:]}")
        return
    print(f"native load_file-like loop over {size / GB:.2f} GB, seconds per step (GB/s):")
    for name, s in json.loads(r.stdout.strip().splitlines()[-1]).items():
        print(f"  {name:<44}{s:>8.3f} s {size / s / GB:>8.2f} GB/s")


# ---- main -----------------------------------------------------------------------------------------------

CASES = ("load_file", "load_file_warm", "safe_open", "vllm", "state_dict", "from_pretrained", "cold", "idle")


def also_env(spec: str, base: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(name, environment) of one --also NAME:k=v,... configuration."""
    from gpudash.preload.shm import preload_env

    name, _, items = spec.partition(":")
    pairs = [kv.split("=", 1) for kv in items.split(",") if kv]
    if not name or any(len(p) != 2 for p in pairs):
        raise SystemExit(f"--also {spec!r}: expected NAME:k=v,... (knobs lower-case, environment upper-case)")
    env = preload_env(base, f"bench-loaders-{name}", {k: int(v) for k, v in pairs if not k.isupper()})
    return name, env | {k: v for k, v in pairs if k.isupper()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="where the generated files go (about 2.1x the file size)")
    ap.add_argument("--layers", type=int, default=12, help="layers of the safetensors file (12: 7.3 GB)")
    ap.add_argument("--model-layers", type=int, default=6, help="layers of the transformers model (6: 4.7 GB)")
    ap.add_argument("--rounds", type=int, default=3, help="processes each way per case (median)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--also", action="append", default=[], metavar="NAME:k=v,...",
                    help="another preloaded configuration taking turns in every round")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    from gpudash.preload.shm import preload_env

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    cases = [c for c in args.cases.split(",") if c]
    path = d / f"llama-l{args.layers}.safetensors"
    t = time.perf_counter()
    make_file(path, args.layers)
    if "from_pretrained" in cases:
        make_model(d / f"llama-model-l{args.model_layers}", args.model_layers)
    print(f"files ready in {time.perf_counter() - t:.1f} s: {path.name} {path.stat().st_size / GB:.2f} GB")
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env = preload_env(base, "bench-loaders", {k: int(v) for k, v in (kv.split("=", 1) for kv in args.knob)})
    env |= dict(kv.split("=", 1) for kv in args.env)
    configs = {"preload": env} | dict(also_env(spec, base) for spec in args.also)
    if args.knob or args.env:
        print(f"preloaded runs: knobs {args.knob}, environment {args.env}")
    for spec in args.also:
        print(f"also: {spec}")
    if args.trace:
        trace(args, env)
    if args.breakdown:
        breakdown(args, base)
    rows, ok = [], True
    for case in cases:
        runs: dict[str, list[dict[str, Any]]] = {"native": [], **{name: [] for name in configs}}
        for _ in range(args.rounds):
            if case != "cold":  # each cold run drops the page cache first
                read_through(sorted(d.glob("llama-model-*/*.safetensors")) if case == "from_pretrained" else [path])
            for name, e in (("native", base), *configs.items()):
                runs[name].append(run_child(case, args, e))
        if "skipped" in runs["native"][0]:
            print(f"{case}: {runs['native'][0]['skipped']}")
            continue
        if case == "idle":
            ms = {n: statistics.median(r["cpu_s"] for r in rs) * 1e3 for n, rs in runs.items()}
            print("idle 5 s after a copy, process CPU (median): " + ", ".join(f"{n} {v:.1f} ms" for n, v in ms.items()))
            continue
        med = {n: statistics.median(r["s"] for r in rs) for n, rs in runs.items()}
        cpu = {n: statistics.median(r["cpu_s"] / (r["bytes"] / GB) for r in rs) for n, rs in runs.items()}
        nbytes = runs["native"][0]["bytes"]
        if case == "from_pretrained":
            good = all(r["fingerprint"] == runs["native"][0]["fingerprint"] for rs in runs.values() for r in rs)
        else:
            good = all(r["exact"] for rs in runs.values() for r in rs)
        ok &= good
        for name in configs:
            label = case if name == "preload" else f"{case} [{name}]"
            rows.append((label, nbytes, {"native": med["native"], "preload": med[name]},
                         {"native": cpu["native"], "preload": cpu[name]}, good, runs, name))
            print(f"{label}: native {med['native']:.3f} s, {name} {med[name]:.3f} s "
                  f"({med['native'] / med[name]:.2f}x), {'exact' if good else 'NOT EXACT'}", flush=True)
    print(f"\n{'case':<24}{'GB':>6}{'native s':>10}{'preload s':>11}{'ratio':>7}{'GB/s':>14}"
          f"{'CPU s/GB':>16}{'exact':>7}")
    for label, nbytes, med, cpu, good, runs, name in rows:
        print(f"{label:<24}{nbytes / GB:>6.2f}{med['native']:>10.3f}{med['preload']:>11.3f}"
              f"{med['native'] / med['preload']:>6.2f}x{nbytes / med['native'] / GB:>7.2f}"
              f"{nbytes / med['preload'] / GB:>7.2f}{cpu['native']:>8.3f}{cpu['preload']:>8.3f}"
              f"{'ok' if good else 'NO':>7}")
    print(f"medians of {args.rounds} processes each way; GB/s and CPU s/GB: native, preload (process CPU)")
    for label, _, _, _, _, runs, name in rows:
        print(f"{label}: seconds native {[round(r['s'], 3) for r in runs['native']]}, "
              f"{name} {[round(r['s'], 3) for r in runs[name]]}; last preloaded run's stats block:")
        for line in runs[name][-1].get("preload", []):
            print(f"    {line}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
