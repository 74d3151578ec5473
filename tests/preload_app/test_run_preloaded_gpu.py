"""`gpudash run` with the real libgpudash_preload.so on a GPU: PyTorch's own copies are taken by the
engine inside the process, land byte for byte, and show in the process's stats block; with
GPUDASH_PRELOAD=off they pass through. Run on a GPU machine: pytest -m gpu tests/preload_app."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# 64 MiB each way through PyTorch (cudart's cudaMemcpyAsync), checked, then this process's stats block as
# published after the copies (the process publishes every 100 ms: an older publish predates them).
PROGRAM = """
import json, os, time, numpy as np, torch
from gpudash.preload.shm import StatsView
n = 64 << 20
src = torch.from_numpy(np.arange(n // 8, dtype=np.int64))
dev = src.cuda()
back = dev.cpu()
torch.cuda.synchronize()
done = time.time()
exact = bool(torch.equal(back, src)) and bool(torch.equal(dev, torch.arange(n // 8, device="cuda")))
with StatsView(os.getpid()) as view:
    s = view.read_after(done)
print(json.dumps({"exact": exact, "state": s.state, "name": s.name,
                  "h2d_taken": s.h2d.copies_taken, "d2h_taken": s.d2h.copies_taken,
                  "h2d_bytes": s.h2d.bytes_taken, "d2h_bytes": s.d2h.bytes_taken}))
"""


def _run(env: dict[str, str]) -> dict:
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-m", "gpudash", "run", "--name", "torch-probe", "--", sys.executable, "-c",
                        PROGRAM], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_torch_copies_are_taken_by_the_engine_and_exact() -> None:
    got = _run({**os.environ, "GPUDASH_PRELOAD": "on"})
    assert got["exact"] and got["state"] == "active" and got["name"] == "torch-probe"
    assert got["h2d_taken"] >= 1 and got["d2h_taken"] >= 1
    assert got["h2d_bytes"] >= 64 << 20 and got["d2h_bytes"] >= 64 << 20


def test_the_kill_switch_passes_everything_through() -> None:
    got = _run({**os.environ, "GPUDASH_PRELOAD": "off"})
    assert got["exact"] and got["state"] == "off"
    assert got["h2d_taken"] == 0 and got["d2h_taken"] == 0
