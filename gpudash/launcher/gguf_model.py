"""A tiny random-weight LLaMA model written as GGUF with the `gguf` package.

It exists so llama-server can be started for real in seconds on a laptop or CI box: the demo setup, the
tests and the benchmarks serve it. The vocabulary is SentencePiece-style (`llama`) with <unk>, <s>, </s>
and the 256 byte tokens, so any text tokenizes (one token per byte); the output is random bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class DemoModelShape:
    """Sizes of the generated model; prefill cost grows with layers * embedding**2 * prompt length."""

    layers: int = 2
    embedding: int = 64
    heads: int = 4
    heads_kv: int = 4
    feed_forward: int = 128
    context: int = 4096

    def __post_init__(self) -> None:
        if self.layers < 1 or self.embedding < 8 or self.heads < 1 or self.feed_forward < 1:
            raise ValueError("layers, heads and feed_forward must be >= 1 and embedding >= 8")
        if self.embedding % self.heads or self.heads % self.heads_kv:
            raise ValueError(f"embedding ({self.embedding}) must divide by heads ({self.heads}) "
                             f"and heads by heads_kv ({self.heads_kv})")


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    scores = [0.0] * len(tokens)
    types = [int(gguf.TokenType.UNKNOWN), int(gguf.TokenType.CONTROL), int(gguf.TokenType.CONTROL)]
    types += [int(gguf.TokenType.BYTE)] * 256
    return tokens, scores, types


def write_demo_model(path: Path | str, shape: DemoModelShape = DemoModelShape(), seed: int = 0) -> Path:
    """Write the model to `path` atomically (a temp file renamed into place) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab, d, ff = len(tokens), shape.embedding, shape.feed_forward
    head_dim = d // shape.heads
    kv = head_dim * shape.heads_kv

    def rand(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("gpudash-demo")
    w.add_context_length(shape.context)
    w.add_embedding_length(d)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.heads_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    # numpy shapes are (rows, cols) = GGUF ne reversed: token_embd is ne [d, n_vocab].
    w.add_tensor("token_embd.weight", rand(n_vocab, d))
    for i in range(shape.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(d, d))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(kv, d))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(kv, d))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(d, d))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(ff, d))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(ff, d))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(d, ff))
    w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    w.add_tensor("output.weight", rand(n_vocab, d))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    os.replace(tmp, path)
    return path
