"""llama.cpp has no memory-share flag: on real GPUs the supervisor runs a server with a `share` at the
-ngl/-c that fit it (gpudash.launcher.kinds.llama_cpp.budget_spec), and says so in a server.budget event."""

from __future__ import annotations

import pytest
from launcher_helpers import Events

from gpudash.config import ServerSpec
from gpudash.launcher.kinds.llama_cpp import budget_spec
from gpudash.launcher.shares import model_shape

pytestmark = pytest.mark.llama
GiB = 1 << 30


def _command_line(sup, name: str) -> list[str]:
    header = next(line for line in sup.log_path(name).read_text().splitlines() if line.startswith("=== gpudash"))
    return header.split(": ", 1)[1].split()


@pytest.mark.parametrize("gpu_bytes", [1 * GiB, 64 * GiB])
def test_share_sets_layers_and_context(make_supervisor, events: Events, tiny_model, llama_server,
                                       gpu_bytes: int) -> None:
    spec = ServerSpec(name="s", model=str(tiny_model), binary=llama_server, ctx_size=512, gpus=[0], share=0.5)
    sup = make_supervisor([spec], gpu_memory=lambda: {0: gpu_bytes})
    sup.start_all()
    argv = _command_line(sup, "s")
    _, budget = budget_spec(spec, {0: gpu_bytes}, model_shape(tiny_model))
    assert argv[argv.index("-ngl") + 1] == str(budget.n_gpu_layers)
    assert argv[argv.index("-c") + 1] == str(budget.ctx_size)
    (ev,) = [e for e in events.drain() if e.kind == "server.budget"]
    assert ev.target == "s" and ev.new == budget.argv() and ev.reason == budget.note


def test_half_of_one_gib_keeps_the_layers_off_the_gpu(tiny_model) -> None:
    spec = ServerSpec(name="s", model=str(tiny_model), ctx_size=512, gpus=[0], share=0.5)
    _, small = budget_spec(spec, {0: 1 * GiB}, model_shape(tiny_model))
    _, large = budget_spec(spec, {0: 64 * GiB}, model_shape(tiny_model))
    assert small.n_gpu_layers < large.n_gpu_layers  # the share, not the model, bounds the small GPU


def test_without_real_gpus_the_spec_runs_as_written(make_supervisor, events: Events, tiny_model,
                                                    llama_server) -> None:
    spec = ServerSpec(name="s", model=str(tiny_model), binary=llama_server, ctx_size=512, share=0.5)
    sup = make_supervisor([spec], gpu_memory=lambda: {})
    sup.start_all()
    assert "-ngl" not in _command_line(sup, "s")
    assert not [e for e in events.drain() if e.kind == "server.budget"]


def test_a_model_the_budget_cannot_read_is_one_launch_error(make_supervisor, events: Events, tmp_path,
                                                             llama_server) -> None:
    import gguf
    import numpy as np

    from gpudash.launcher.errors import LaunchError

    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(3)
    w.add_embedding_length(32)
    w.add_head_count(4)
    w.add_head_count_kv([2, 2])  # per-layer array, one value short
    w.add_tensor("token_embd.weight", np.zeros((10, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    spec = ServerSpec(name="s", model=str(path), binary=llama_server, gpus=[0], share=0.5)
    sup = make_supervisor([spec], gpu_memory=lambda: {0: 16 * GiB})
    with pytest.raises(LaunchError, match=r"head_count_kv' is an array of 2 values for 3 layers.*remove `share`"):
        sup.start_all()
    assert sup.pids() == {}
