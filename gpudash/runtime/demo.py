"""The embedded default: with no [[servers]] configured, one llama-server on a generated demo model.

The model is written once into the user cache directory. It is large enough that prompt processing
takes visible time on a CPU (so prefix-cache hits show as lower TTFT) and small enough to load in
milliseconds. llama-server offloads to the GPUs by itself when its build and the box have them.
"""

from __future__ import annotations

from pathlib import Path

import platformdirs

from gpudash.config import APP_NAME, Config, LlamaCppSpec, ServerSpec
from gpudash.config.servers import DEMO_NAME
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model

DEMO_SHAPE = DemoModelShape(layers=4, embedding=256, heads=4, heads_kv=4, feed_forward=512, context=8192)


def demo_model_path(cache_dir: Path | None = None) -> Path:
    """The cached demo model, written on first use (its name carries the shape, so a new shape rewrites it)."""
    s = DEMO_SHAPE
    base = Path(cache_dir) if cache_dir is not None else Path(platformdirs.user_cache_dir(APP_NAME))
    path = base / f"demo-llama-l{s.layers}-e{s.embedding}-f{s.feed_forward}-c{s.context}.gguf"
    if not path.exists():
        write_demo_model(path, DEMO_SHAPE)
    return path


def default_servers(config: Config, cache_dir: Path | None = None) -> list[ServerSpec]:
    """The demo server list; enough slots that the probe's concurrent requests never queue."""
    return [LlamaCppSpec(name=DEMO_NAME, model=str(demo_model_path(cache_dir)),
                       ctx_size=DEMO_SHAPE.context, parallel=max(2, config.probe.concurrency),
                       health_timeout_s=60.0)]
