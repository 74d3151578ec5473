"""The llama.cpp VRAM budget against what a CUDA llama-server places: three -ngl values, side by side.

For each -ngl the CUDA llama-server loads a generated model and prints its buffers per device
(`load_tensors: CUDA0 model buffer size = ... MiB`, `llama_kv_cache: CUDA0 KV buffer size = ... MiB`).
gpudash's budget (gpudash/launcher/shares.py gpu_bytes: the output layer first, then the last -ngl - 1 blocks,
each block's KV cache with it; token_embd on the CPU) must match the sum of the CUDA model and KV
buffers within 2%. Compute buffers are left out on both sides: the budget's fixed overhead covers them.

Run on the GPU machine (needs a CUDA llama-server: `gpudash llama build`, or pass --binary):
  PYTHONPATH=. python benchmarks/bench_ngl_budget.py [--binary PATH] [--out benchmarks/results/ngl_budget.txt]
Exit code 1 when a row is off by more than 2%.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.health import NotHealthy, free_port, wait_healthy
from gpudash.config import LlamaCppSpec
from gpudash.launcher.kinds.llama_cpp import LlamaCpp
from gpudash.launcher.shares import MiB, gpu_bytes, gpu_part, model_shape

# Large enough that the buffers are hundreds of MiB (rounding in the log is 0.01 MiB), small enough to write fast.
SHAPE = DemoModelShape(layers=12, embedding=1024, heads=16, heads_kv=4, feed_forward=2816, context=4096)
CTX = 4096
TOLERANCE = 0.02
_BUFFER = re.compile(r"\b(CUDA\d+)\s+(model|KV) buffer size\s*=\s*([0-9.]+) MiB")


def placed(log: str) -> tuple[float, float]:
    """(model, KV) MiB the log says the CUDA devices got, summed over devices."""
    model = kv = 0.0
    for _dev, what, mib in _BUFFER.findall(log):
        if what == "model":
            model += float(mib)
        else:
            kv += float(mib)
    return model, kv


def load_log(binary: str, model: Path, ngl: int, timeout_s: float = 300.0) -> str:
    """Start llama-server at -ngl `ngl`, wait until it is healthy, stop it; its whole output."""
    port = free_port()
    cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-ngl", str(ngl), "-c", str(CTX),
           "-np", "1", "-ctk", "f16", "-ctv", "f16", "-fit", "off", "-lv", "4"]  # -lv 4: the buffer lines
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}/health", timeout_s)
        except NotHealthy:
            pass  # the output says why, and the caller finds no buffer lines in it
        finally:
            proc.terminate()
            proc.wait(30)
        out.seek(0)
        return out.read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=None, help="CUDA llama-server (default: what gpudash would launch)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = ap.parse_args()
    binary = args.binary or LlamaCpp().find_binary(LlamaCppSpec(name="bench", model="-"))
    with tempfile.TemporaryDirectory() as tmp:
        path = write_demo_model(Path(tmp) / "budget.gguf", SHAPE)
        shape = model_shape(path)
        n = shape.layers
        lines = [f"bench_ngl_budget: {binary}",
                 f"model {SHAPE} ({path.stat().st_size / MiB:.1f} MiB), -c {CTX}, f16 KV", "",
                 f"{'-ngl':>5} {'blocks':>6} {'output':>6} {'gpudash MiB':>12} {'llama.cpp MiB':>14} "
                 f"{'(model + KV)':>18} {'diff':>7}"]
        worst = 0.0
        for ngl in (1, n // 2, n + 1):
            blocks, output = gpu_part(shape, ngl)
            expect = gpu_bytes(shape, ngl, CTX) / MiB
            model_mib, kv_mib = placed(load_log(binary, path, ngl))
            got = model_mib + kv_mib
            diff = (expect - got) / got if got else float("inf")
            worst = max(worst, abs(diff))
            lines.append(f"{ngl:>5} {blocks:>6} {'GPU' if output else 'CPU':>6} {expect:>12.2f} {got:>14.2f} "
                         f"{f'{model_mib:.2f} + {kv_mib:.2f}':>18} {diff:>+7.2%}")
        lines += ["", f"worst difference {worst:.2%} (tolerance {TOLERANCE:.0%})"]
        if worst == float("inf"):
            lines.append("the server's log names no CUDA buffer: this llama-server is not a CUDA build")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
