"""Share accounting and warnings over hand-built snapshots, and the llama.cpp budget arithmetic
(model shapes read from real GGUF files written with the gguf package)."""

from __future__ import annotations

from pathlib import Path

import pytest

import gguf
import numpy as np

from gpudash.config import ServerSpec
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.kinds.llama_cpp import budget_spec
from gpudash.records import Event, GpuProcessSample, GpuSample, Snapshot
from gpudash.launcher.shares import (
    MiB, ModelShape, effective_share, gpu_bytes, gpu_part, llama_budget, model_shape, over_share_warnings,
    oversubscription_warnings, share_usage, share_warnings, start_warnings,
)

GiB = 1 << 30


def spec(name: str, **kw: object) -> ServerSpec:
    return ServerSpec(name=name, model="m.gguf", **kw)  # type: ignore[arg-type]


def snap(used: dict[int, int], procs: list[tuple[int, int, int | None, str | None]], events: tuple = ()) -> Snapshot:
    """GPUs of 16 GiB with `used` bytes; procs are (gpu, pid, bytes, server)."""
    gpus = tuple(GpuSample(ts=1.0, index=i, uuid=f"GPU-{i}", name="sim", mem_used=u, mem_total=16 * GiB)
                 for i, u in used.items())
    rows = tuple(GpuProcessSample(ts=1.0, gpu_index=g, pid=p, used_bytes=b, server=s) for g, p, b, s in procs)
    return Snapshot(ts=1.0, tick=1, source="sim:rtx5080+rtx3090", gpus=gpus, gpu_processes=rows, events=events)


def test_effective_share() -> None:
    assert effective_share(spec("a", share=0.3)) == 0.3
    assert effective_share(spec("v", kind="vllm", share=0.3, gpu_memory_utilization=0.5)) == 0.5
    assert effective_share(spec("v", kind="vllm")) == 0.9
    assert effective_share(spec("a")) is None


def test_usage_maps_processes_to_servers() -> None:
    specs = [spec("small", share=0.3, gpus=[0]), spec("big", share=0.6)]
    s = snap({0: 10 * GiB, 1: 2 * GiB},
             [(0, 11, 3 * GiB, "small"), (0, 12, 5 * GiB, "big"), (0, 13, 1 * GiB, "big"), (1, 12, 2 * GiB, "big"),
              (0, 99, 1 * GiB, None)])
    u = {(x.server, x.gpu): x for x in share_usage(s, specs)}
    assert set(u) == {("small", 0), ("big", 0), ("big", 1)}
    assert u["small", 0].used == 3 * GiB and u["small", 0].budget == int(0.3 * 16 * GiB)
    assert u["big", 0].used == 6 * GiB and u["big", 0].used_fraction == pytest.approx(6 / 16)
    assert u["big", 1].used == 2 * GiB


def test_usage_unknown_when_nvml_cannot_read() -> None:
    specs = [spec("a", share=0.5, gpus=[0, 1])]
    s = snap({0: GiB, 1: GiB}, [(0, 5, None, "a")])
    u = {x.gpu: x.used for x in share_usage(s, specs)}
    assert u == {0: None, 1: None}  # NA on GPU 0; no process rows at all on GPU 1
    s = snap({0: GiB, 1: GiB}, [(1, 6, GiB, "other")])
    assert {x.gpu: x.used for x in share_usage(s, specs)} == {0: None, 1: 0}


def test_oversubscription() -> None:
    specs = [spec("a", share=0.6, gpus=[0]), spec("b", share=0.5), spec("v", kind="vllm", gpus=[1])]
    w = oversubscription_warnings(specs, [0, 1])
    assert [(x.gpu, x.servers) for x in w] == [(0, ("a", "b")), (1, ("b", "v"))]
    assert "GPU 0: shares add up to 1.10 (a 0.6 + b 0.5)" in w[0].message
    assert "b 0.5 + v 0.9" in w[1].message
    assert oversubscription_warnings([spec("a", share=0.5), spec("b", share=0.5)], [0]) == []


def test_over_share_with_tolerance() -> None:
    specs = [spec("a", share=0.25, gpus=[0])]
    at = snap({0: 4 * GiB}, [(0, 1, 4 * GiB, "a")])
    assert over_share_warnings(share_usage(at, specs)) == []  # exactly at its share
    over = snap({0: 5 * GiB}, [(0, 1, 5 * GiB, "a")])
    w = over_share_warnings(share_usage(over, specs))
    assert [(x.kind, x.gpu, x.servers) for x in w] == [("over_share", 0, ("a",))]
    assert "a holds 5120 MiB on GPU 0, above its share 0.25 (4096 MiB)" in w[0].message


def test_start_warning_counts_what_the_server_already_holds() -> None:
    a = spec("a", share=0.5, gpus=[0])
    busy = snap({0: 10 * GiB}, [(0, 1, 10 * GiB, "other")])
    w = start_warnings(busy, a)
    assert len(w) == 1 and "starts with 6144 MiB free on GPU 0, below its share 0.5 (8192 MiB)" in w[0].message
    own = snap({0: 10 * GiB}, [(0, 1, 4 * GiB, "a"), (0, 2, 6 * GiB, "other")])
    assert start_warnings(own, a) == []
    assert start_warnings(busy, spec("nobudget", gpus=[0])) == []


def test_share_warnings_for_a_tick() -> None:
    specs = [spec("a", share=0.5, gpus=[0]), spec("b", share=0.6, gpus=[0])]
    ev = (Event(ts=1.0, actor="supervisor", kind="server.start", target="b"),)
    s = snap({0: 12 * GiB}, [(0, 1, 9 * GiB, "a"), (0, 2, 3 * GiB, "b")], events=ev)
    kinds = sorted(w.kind for w in share_warnings(s, specs))
    assert kinds == ["low_free_at_start", "over_share", "oversubscribed"]
    quiet = snap({0: 6 * GiB}, [(0, 1, 6 * GiB, "a")])
    assert share_warnings(quiet, [spec("a", share=0.5, gpus=[0])]) == ()


# ---- llama.cpp budget -------------------------------------------------------------------------
SHAPE = ModelShape(layers=32, layer_bytes=(200 * MiB,) * 32, output_bytes=500 * MiB, heads_kv=(8,) * 32, key_length=128,
                   value_length=128, context_train=32768)
KV_TOKEN = 32 * 8 * 256 * 2  # bytes per token over all layers, f16


def test_budget_everything_fits() -> None:
    b = llama_budget(SHAPE, 16 * GiB, ctx_wanted=8192, overhead_bytes=512 * MiB)
    assert (b.n_gpu_layers, b.ctx_size, b.note) == (33, 8192, "fits")
    assert b.estimate_bytes == 512 * MiB + 32 * 200 * MiB + 500 * MiB + 8192 * KV_TOKEN
    assert b.argv() == ["-ngl", "33", "-c", "8192"]


def test_budget_cuts_context_first() -> None:
    weights = 32 * 200 * MiB + 500 * MiB
    budget = 512 * MiB + weights + 10000 * KV_TOKEN
    b = llama_budget(SHAPE, budget, overhead_bytes=512 * MiB)  # wants the trained 32768
    assert b.n_gpu_layers == 33 and b.ctx_size == 9984 and "cut from 32768 to 9984" in b.note
    assert b.estimate_bytes <= budget


def test_budget_moves_layers_to_cpu_last() -> None:
    b = llama_budget(SHAPE, 4 * GiB, ctx_wanted=8192, overhead_bytes=512 * MiB)
    per_layer = 200 * MiB + 4096 * KV_TOKEN // 32
    # llama.cpp offloads the output layer first, then the last blocks: -ngl k holds output + k - 1 blocks
    assert b.ctx_size == 4096 and b.n_gpu_layers == 1 + (4 * GiB - 512 * MiB - 500 * MiB) // per_layer
    assert b.estimate_bytes <= 4 * GiB and "14 of 32 blocks and the output layer on the GPU" in b.note
    assert llama_budget(SHAPE, 256 * MiB).n_gpu_layers == 0


def llama_cpp_places(shape: ModelShape, ngl: int, tokens: int) -> int:
    """Bytes on the GPU at -ngl `ngl` by src/llama-model.cpp's rule, written out independently: layer il
    (0..n_layer, where n_layer is the output layer) is on the GPU when il >= max(n_layer + 1 - ngl, 0)."""
    n = shape.layers
    start = max(n + 1 - ngl, 0)
    on_gpu = [il for il in range(n + 1) if il >= start and il - start < min(ngl, n + 1)]
    per_token = shape.key_length * 2 + shape.value_length * 2  # f16 K and V per KV head
    return sum(shape.output_bytes if il == n else shape.layer_bytes[il] + per_token * shape.heads_kv[il] * tokens
               for il in on_gpu)


def test_budget_places_layers_as_llama_cpp_does() -> None:
    """Every -ngl, and every budget: what the budget expects is what llama.cpp places, never over the share."""
    shape = ModelShape(layers=32, layer_bytes=(130 * MiB,) * 32, output_bytes=410 * MiB, heads_kv=(8,) * 32,
                       key_length=128, value_length=128, context_train=8192)  # an 8B Q4_K_M-like shape
    for ngl in range(0, 34):
        assert gpu_bytes(shape, ngl, 4096) == llama_cpp_places(shape, ngl, 4096), ngl
    assert gpu_part(shape, 32) == (31, True)  # -ngl n_layer leaves block 0 on the CPU
    for budget in range(600 * MiB, 6 * GiB, 97 * MiB):
        b = llama_budget(shape, budget, ctx_wanted=4096, overhead_bytes=512 * MiB)
        assert b.estimate_bytes == 512 * MiB + llama_cpp_places(shape, b.n_gpu_layers, b.ctx_size)
        assert b.estimate_bytes <= budget or b.n_gpu_layers == 0


def test_budget_respects_configured_layers_and_cache_types() -> None:
    b = llama_budget(SHAPE, 16 * GiB, ctx_wanted=4096, ngl_max=10, overhead_bytes=0)
    # -ngl 10: the output layer and the last 9 blocks, with their KV cache
    assert b.n_gpu_layers == 10 and b.estimate_bytes == 500 * MiB + 9 * 200 * MiB + 4096 * KV_TOKEN * 9 // 32
    q = llama_budget(SHAPE, 16 * GiB, ctx_wanted=4096, cache_type_k="q8_0", cache_type_v="q4_0", overhead_bytes=0)
    assert q.estimate_bytes < 32 * 200 * MiB + 500 * MiB + 4096 * KV_TOKEN
    with pytest.raises(ValueError, match="KV cache type 'q3' is unknown"):
        llama_budget(SHAPE, GiB, cache_type_k="q3")
    with pytest.raises(ValueError, match="budget_bytes must be positive"):
        llama_budget(SHAPE, 0)


def test_model_shape_from_gguf_and_budget_spec(tmp_path: Path) -> None:
    path = write_demo_model(tmp_path / "m.gguf", DemoModelShape(layers=4, embedding=64, heads=4, heads_kv=2,
                                                                 feed_forward=128, context=2048))
    shape = model_shape(path)
    assert (shape.layers, shape.heads_kv, shape.key_length, shape.context_train) == (4, (2,) * 4, 16, 2048)
    per_layer = 4 * (64 + 64 * 64 * 2 + 32 * 64 * 2 + 64 + 128 * 64 * 3)
    assert shape.layer_bytes == (per_layer,) * 4
    assert shape.output_bytes == 4 * (64 + 259 * 64)
    s = spec("tiny", share=0.001, gpus=[0], ctx_size=1024)
    new, b = budget_spec(s, {0: 16 * GiB}, shape, overhead_bytes=0)
    assert b is not None and (new.n_gpu_layers, new.ctx_size) == (5, 1024)
    assert b.budget_bytes == int(0.001 * 16 * GiB)
    unchanged, none = budget_spec(spec("free"), {0: 16 * GiB}, shape)
    assert none is None and unchanged.n_gpu_layers is None
    with pytest.raises(ValueError, match="uses GPU 3, which this box does not have"):
        budget_spec(spec("x", share=0.5, gpus=[3]), {0: GiB}, shape)
    junk = tmp_path / "x.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    for bad in (junk, tmp_path / "missing.gguf"):
        with pytest.raises(ValueError, match=r"is not a readable GGUF model file .*; point `model` at a .gguf file"):
            model_shape(bad)


def _gguf(path: Path, heads_kv: int | list[int], tied: bool, layers: int = 3) -> Path:
    """A small llama-architecture GGUF: 4 heads of 8 over 32 embeddings, vocab 100, f32."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_embedding_length(32)
    w.add_head_count(4)
    w.add_head_count_kv(heads_kv)
    w.add_context_length(512)
    w.add_tensor("token_embd.weight", np.zeros((100, 32), dtype=np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((32, 32), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", np.zeros((100, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tied_embeddings_count_a_copy_of_token_embd_on_the_output_device(tmp_path: Path) -> None:
    untied = model_shape(_gguf(tmp_path / "u.gguf", 2, tied=False))
    tied = model_shape(_gguf(tmp_path / "t.gguf", 2, tied=True))
    # without output.weight llama.cpp duplicates token_embd (100 x 32 f32) as the output layer
    assert untied.output_bytes == tied.output_bytes == 4 * 32 + 4 * 100 * 32


def test_per_layer_kv_heads_are_read_and_budgeted(tmp_path: Path) -> None:
    shape = model_shape(_gguf(tmp_path / "a.gguf", [2, 0, 4], tied=True))
    assert shape.heads_kv == (2, 0, 4)
    per_head = 8 * 2 + 8 * 2  # K and V of one head, f16
    assert shape.kv_bytes(10, 3) == 10 * per_head * 6
    assert shape.kv_bytes(10, 1) == 10 * per_head * 4  # the last layer goes to the GPU first
    new, b = budget_spec(spec("arr", share=0.5, gpus=[0]), {0: 16 * GiB}, shape, overhead_bytes=0)
    assert b is not None and new.n_gpu_layers == 4


def test_a_kv_head_array_of_the_wrong_length_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"head_count_kv' is an array of 2 values for 3 layers"):
        model_shape(_gguf(tmp_path / "bad.gguf", [2, 2], tied=True))


@pytest.mark.parametrize("ngl, want", [("all", 5), ("auto", 5), (-1, 5), (-2, 5), (2, 2)])
def test_budget_reads_all_and_auto_as_no_cap(tmp_path: Path, ngl: int | str, want: int) -> None:
    shape = model_shape(write_demo_model(tmp_path / "m.gguf", DemoModelShape(layers=4, embedding=64)))
    new, _ = budget_spec(spec("n", share=0.5, gpus=[0], n_gpu_layers=ngl), {0: 16 * GiB}, shape)
    assert new.n_gpu_layers == want
