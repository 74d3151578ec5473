"""A model file is read only as far as its size and any real model's limits allow: a GGUF whose counts,
lengths or layer numbers cannot be true ends in one sentence naming the file and the field, before anything
is sized by it (a 288-byte file claiming 10^8 blocks made `plan` allocate 2.4 GB). Files crafted with the
gguf package's own writer, and its header counts changed in place (GGUF v3: magic, version, tensor count,
key count, then the first key's length)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.shares import model_shape
from hostile_helpers import WAIT_S, cli_env, memory_capped

TINY = DemoModelShape(layers=1, embedding=64, heads=2, heads_kv=2, feed_forward=128, context=512)


def _crafted(path: Path, blocks: int, tensors: tuple[str, ...] = ("blk.0.attn_q.weight",)) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(blocks)
    w.add_head_count(1)
    w.add_embedding_length(8)
    for name in tensors:
        w.add_tensor(name, np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _patched(tmp: Path, offset: int, value: int) -> Path:
    good = write_demo_model(tmp / "good.gguf", TINY)
    data = bytearray(good.read_bytes())
    data[offset:offset + 8] = struct.pack("<Q", value)
    bad = tmp / "bad.gguf"
    bad.write_bytes(bytes(data))
    return bad


def _cut(tmp: Path, size: int) -> Path:
    bad = tmp / "bad.gguf"
    bad.write_bytes(write_demo_model(tmp / "good.gguf", TINY).read_bytes()[:size])
    return bad


CASES = {
    "zero blocks": (lambda tmp: _crafted(tmp / "bad.gguf", 0), "llama.block_count"),
    "more blocks than tensors": (lambda tmp: _crafted(tmp / "bad.gguf", 5000), "llama.block_count"),
    "a tensor past the blocks": (lambda tmp: _crafted(tmp / "bad.gguf", 1, ("blk.0.a.weight", "blk.7.a.weight")),
                                 "blk.7.a.weight"),
    "a block number in other digits": (lambda tmp: _crafted(tmp / "bad.gguf", 1, ("blk.0.a.weight", "blk.².a.weight")),
                                       "blk.².a.weight"),
    "truncated": (lambda tmp: _cut(tmp, 2000), "runs past the end of the file"),
    "a huge tensor count": (lambda tmp: _patched(tmp, 8, 10**15), "tensor count"),
    "a huge key count": (lambda tmp: _patched(tmp, 16, 10**15), "key count"),
    "a huge string length": (lambda tmp: _patched(tmp, 24, 10**15), "string length"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_model_is_one_sentence_naming_file_and_field(tmp_path: Path, case: str) -> None:
    make, field = CASES[case]
    path = make(tmp_path)
    with pytest.raises(ValueError) as caught:
        model_shape(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and field in message and "\n" not in message, message


def test_plan_on_a_tiny_file_claiming_1e8_blocks_exits_2_without_allocating(tmp_path: Path) -> None:
    model = _crafted(tmp_path / "m.gguf", 10**8)
    assert model.stat().st_size < 1000
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "m"\nkind = "llama.cpp"\nmodel = "{model}"\n')
    r = subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", "--config", str(cfg), "plan"],
                       capture_output=True, text=True, env=cli_env(tmp_path), timeout=WAIT_S,
                       preexec_fn=memory_capped())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert str(model) in r.stderr and "block_count" in r.stderr
