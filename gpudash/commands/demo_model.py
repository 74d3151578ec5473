"""`gpudash demo-model OUT.gguf`: write a tiny random-weight LLaMA model for trying llama-server."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from gpudash import fmt
from gpudash.commands.common import usage_error
from gpudash.commands.output import echo_fitted


def folder_problem(out: Path) -> None:
    """Refuse (exit 2) a path whose folder is missing or is a file: a model goes where the user has a folder
    (--db and export never guess folders either); the first ancestor that exists says what is wrong."""
    folder = out.expanduser().absolute().parent
    if folder.is_dir():
        return
    nearest = next(p for p in [folder, *folder.parents] if p.exists())  # "/" exists
    if nearest.is_dir():
        usage_error(f"cannot write {out}: the folder {folder} does not exist; create it first "
                    f"(mkdir -p {folder}) or pick a path in a folder that exists")
    usage_error(f"cannot write {out}: {nearest} is a file, not a folder; pick a path in a folder")


@click.command("demo-model")
@click.argument("out", type=click.Path(dir_okay=False, writable=True))
@click.option("--layers", type=click.IntRange(min=1, max=256), default=2, show_default=True,
              help="Transformer blocks.")
@click.option("--embedding", type=click.IntRange(min=8, max=8192), default=64, show_default=True,
              help="Embedding length (a multiple of --heads); prompt processing cost grows with its square.")
@click.option("--heads", type=click.IntRange(min=1, max=256), default=4, show_default=True, help="Attention heads.")
@click.option("--context", type=click.IntRange(min=16), default=4096, show_default=True,
              help="Trained context length written into the model.")
def demo_model(out: str, layers: int, embedding: int, heads: int, context: int) -> None:
    """Write a random-weight LLaMA GGUF (byte-level vocab) that llama-server loads in milliseconds."""
    from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model

    try:
        shape = DemoModelShape(layers=layers, embedding=embedding, heads=heads, heads_kv=heads,
                               feed_forward=2 * embedding, context=context)
    except ValueError as err:
        usage_error(f"{err}; pick --embedding as a multiple of --heads")
    folder_problem(Path(out))
    try:
        path = write_demo_model(out, shape)
    except OSError as err:
        usage_error(f"cannot write {out} ({err.strerror or err}); pick a writable path")
    from gpudash.launcher.llama.locate import find_llama_server, missing_text

    size = path.stat().st_size
    server = find_llama_server()  # the venv's llama-server is not on PATH: name the one gpudash would run
    try_it = f"try: {shlex.quote(server)} -m {shlex.quote(str(path))}" if server else \
        f"nothing to try it with yet: {missing_text()}"
    echo_fitted([f"wrote {path} ({fmt.size(size)}, {layers} layers, embedding {embedding})", try_it], "    ")
