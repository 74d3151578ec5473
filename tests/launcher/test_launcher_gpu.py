"""On a real GPU: a supervised server sees exactly the GPUs its spec names, and its memory shows in NVML.

The "server" is a stub that allocates 256 MiB with CuPy on its first visible device and reports how many
devices it sees on /health; llama-server wheels built here are CPU-only and vLLM is not installed.
Run on the GPU machine: ``pytest tests/launcher/test_launcher_gpu.py -m gpu``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox

pytestmark = pytest.mark.gpu
MiB = 2**20

STUB = """
import http.server, json, sys
import cupy
if "--help" in sys.argv:
    print("-m  m\\n--host  h\\n--port  p\\n--metrics  x"); sys.exit(0)
n = cupy.cuda.runtime.getDeviceCount()
block = cupy.ones(256 * 2**20 // 4, dtype=cupy.float32)
cupy.cuda.runtime.deviceSynchronize()
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"devices": n}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _used(index: int) -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)
    finally:
        pynvml.nvmlShutdown()


def test_server_sees_only_its_gpus(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    import pynvml

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    gpu = count - 1  # the last GPU, so a wrong mapping (everything on GPU 0) shows on multi-GPU boxes
    exe = tmp_path / "gpu-stub"
    exe.write_text(f"#!{sys.executable}\n{STUB}")
    exe.chmod(0o755)
    before = _used(gpu)
    sup = Supervisor([ServerSpec(name="g", model=str(exe), binary=str(exe), gpus=[gpu], health_timeout_s=120)],
                     Inbox(), tmp_path / "logs")
    try:
        sup.start_all()
        seen = httpx.get(f"{sup.base_url('g')}/health", trust_env=False, timeout=10).json()
        assert seen["devices"] == 1
        assert _used(gpu) - before >= 256 * MiB
    finally:
        sup.stop_all()
    time.sleep(1.0)
    assert _used(gpu) - before < 256 * MiB  # stopped: the memory went back


def test_real_vllm_sleep_frees_memory_and_wake_is_timed(tmp_path: Path) -> None:
    """Needs vLLM on PATH and a local model: GPUDASH_VLLM_MODEL=/path/to/model (e.g. Qwen3-0.6B)."""
    import os
    import shutil

    model = os.environ.get("GPUDASH_VLLM_MODEL")
    if shutil.which("vllm") is None or not model:
        pytest.skip("set GPUDASH_VLLM_MODEL to a local model directory and put vllm on PATH")
    inbox = Inbox()
    spec = ServerSpec(name="v", kind="vllm", model=model, gpus=[0], share=0.5, enable_sleep_mode=True,
                      enforce_eager=True, max_model_len=2048, health_timeout_s=600)
    sup = Supervisor([spec], inbox, tmp_path / "logs")
    try:
        sup.start_all()
        awake = _used(0)
        asleep = sup.sleep("v", level=1)
        slept_used = _used(0)
        woke = sup.wake("v")
    finally:
        sup.stop_all()
    assert asleep.sleeping is True and woke.sleeping is False
    assert slept_used < awake - 1024 * MiB  # weights and KV cache left the GPU
    kinds = [(e.kind, e.new["seconds"]) for e in inbox.poll()["events"] if e.kind in ("server.sleep", "server.wake")]
    assert [k for k, _ in kinds] == ["server.sleep", "server.wake"] and all(s > 0 for _, s in kinds)
    print(f"\nvLLM sleep level 1: {asleep.seconds:.3f} s; wake: {woke.seconds:.3f} s "
          f"(GPU 0 used {awake / MiB:.0f} MiB awake, {slept_used / MiB:.0f} MiB asleep)")
