"""A tiny random-weight LLaMA model written as GGUF with the `gguf` package.

It exists so llama-server can be started for real in seconds on a laptop or CI box: the demo setup, the
tests and the benchmarks serve it. The vocabulary is SentencePiece-style (`llama`) with <unk>, <s>, </s>
and the 256 byte tokens, so any text tokenizes (one token per byte); the output is random bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from gpudash.private_fs import Pending

MODEL_MODE = 0o644  # a model holds nothing private, and a server under another user may read it


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


def _writer(tmp: Path, shape: DemoModelShape, file_type: int) -> gguf.GGUFWriter:
    """A GGUFWriter for `tmp` holding the model's metadata and vocabulary (no tensors yet)."""
    tokens, scores, types = _vocab()
    head_dim = shape.embedding // shape.heads
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("gpudash-demo")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.embedding)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.feed_forward)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.heads_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(file_type)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return w


def _tensor_shapes(shape: DemoModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor's name and numpy shape (rows, cols) = GGUF ne reversed, in file order; 1-D ones are norms."""
    n_vocab, d, ff = len(_vocab()[0]), shape.embedding, shape.feed_forward
    kv = d // shape.heads * shape.heads_kv
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, d))]
    for i in range(shape.layers):
        out += [(f"blk.{i}.attn_norm.weight", (d,)), (f"blk.{i}.attn_q.weight", (d, d)),
                (f"blk.{i}.attn_k.weight", (kv, d)), (f"blk.{i}.attn_v.weight", (kv, d)),
                (f"blk.{i}.attn_output.weight", (d, d)), (f"blk.{i}.ffn_norm.weight", (d,)),
                (f"blk.{i}.ffn_gate.weight", (ff, d)), (f"blk.{i}.ffn_up.weight", (ff, d)),
                (f"blk.{i}.ffn_down.weight", (d, ff))]
    return out + [("output_norm.weight", (d,)), ("output.weight", (n_vocab, d))]


def write_demo_model(path: Path | str, shape: DemoModelShape = DemoModelShape(), seed: int = 0) -> Path:
    """Write the model to `path` atomically (private_fs.Pending: a new file under an unpredictable name,
    renamed into place) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with Pending(path, MODEL_MODE) as new:
        w = _writer(Path(new.name_for_library), shape, int(gguf.LlamaFileType.ALL_F32))
        for name, dims in _tensor_shapes(shape):
            if len(dims) == 1:
                w.add_tensor(name, np.ones(dims, dtype=np.float32))
            else:
                w.add_tensor(name, (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float32))
        try:
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        finally:
            w.close()
    return path


def write_f16_model(path: Path | str, shape: DemoModelShape, seed: int = 0) -> Path:
    """A large model fast: f16 matrices that are all views of one random buffer (as big as the largest
    matrix), streamed to the file one tensor at a time, so an 8B shape takes seconds of disk writing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = _tensor_shapes(shape)
    largest = max(int(np.prod(dims)) for _, dims in tensors)
    # random sign and mantissa, exponent 2**-7: magnitudes in [0.0078, 0.0156), never inf or NaN
    bits = np.random.default_rng(seed).integers(0, 1 << 16, largest, dtype=np.uint16)
    weights = ((bits & np.uint16(0x83FF)) | np.uint16(0x2000)).view(np.float16)
    with Pending(path, MODEL_MODE) as new:
        w = _writer(Path(new.name_for_library), shape, int(gguf.LlamaFileType.MOSTLY_F16))
        for name, dims in tensors:
            dtype = np.dtype(np.float32 if len(dims) == 1 else np.float16)
            w.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
        try:
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for _, dims in tensors:
                n = int(np.prod(dims))
                w.write_tensor_data(np.ones(dims, dtype=np.float32) if len(dims) == 1 else weights[:n].reshape(dims))
        finally:
            w.close()
    return path
