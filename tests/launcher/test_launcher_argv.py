"""Spec -> argv is a pure function: table tests for both server kinds, flag spellings and GPU sharing."""

from __future__ import annotations

import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.argv import MissingFlag, build_command
from gpudash.launcher.kinds.vllm import gpus_shared_count


def llama(**kw) -> ServerSpec:
    return ServerSpec(name="l", model="/m/a.gguf", **kw)


def vllm(name: str = "v", **kw) -> ServerSpec:
    return ServerSpec(name=name, kind="vllm", model="Qwen/Qwen3-8B", **kw)


LLAMA_BASE = ["llama-server", "-m", "/m/a.gguf", "--host", "127.0.0.1", "--port", "8080", "--metrics"]


@pytest.mark.parametrize("spec, tail", [
    (llama(), []),
    (llama(split_mode="tensor", tensor_split=[2, 3]), ["-sm", "tensor", "-ts", "2,3"]),
    (llama(tensor_split=[0.4, 0.6]), ["-ts", "0.4,0.6"]),
    (llama(n_gpu_layers=99, ctx_size=8192, parallel=4), ["-ngl", "99", "-c", "8192", "-np", "4"]),
    (llama(n_gpu_layers=-1), ["-ngl", "-1"]),
    (llama(n_gpu_layers="all"), ["-ngl", "all"]),
    (llama(n_gpu_layers="auto"), ["-ngl", "auto"]),
    (llama(flash_attn="on", cache_reuse=256, cache_ram_mib=2048, fit="off"),
     ["-fa", "on", "--cache-reuse", "256", "-cram", "2048", "-fit", "off"]),
    (llama(cache_type_k="q8_0", cache_type_v="q4_0"), ["-ctk", "q8_0", "-ctv", "q4_0"]),
    (llama(draft_model="/m/d.gguf", draft_max=16, draft_min=2),
     ["-md", "/m/d.gguf", "--draft-max", "16", "--draft-min", "2"]),
    (llama(extra_args=["--flash-attn", "on"]), ["--flash-attn", "on"]),
    (llama(host="0.0.0.0"), None),
])
def test_llama_argv(spec: ServerSpec, tail: list[str] | None) -> None:
    cmd = build_command(spec, "llama-server", 8080)
    if tail is None:  # host case
        assert cmd.argv[cmd.argv.index("--host") + 1] == "0.0.0.0"
        return
    assert list(cmd.argv) == LLAMA_BASE + tail


@pytest.mark.parametrize("spec, peers, tail", [
    (vllm(), None, []),
    (vllm(share=0.45), None, ["--gpu-memory-utilization", "0.45"]),
    (vllm(share=0.45, gpu_memory_utilization=0.3), None, ["--gpu-memory-utilization", "0.3"]),
    (vllm(tensor_parallel_size=2), None, ["--tensor-parallel-size", "2"]),
    (vllm(enforce_eager=True), None, ["--enforce-eager"]),
    (vllm(enable_prefix_caching=True), None, ["--enable-prefix-caching"]),
    (vllm(enable_prefix_caching=False), None, ["--disable-prefix-caching"]),
    (vllm(enable_sleep_mode=True), None, ["--enable-sleep-mode"]),
    (vllm(extra_args=["--max-model-len", "4096"]), None, ["--max-model-len", "4096"]),
    (vllm(pipeline_parallel_size=2, max_model_len=8192, max_num_seqs=64, kv_offloading_size=16,
          kv_offloading_backend="native"), None,
     ["--pipeline-parallel-size", "2", "--max-model-len", "8192", "--max-num-seqs", "64",
      "--kv-offloading-size", "16", "--kv-offloading-backend", "native"]),
    # three servers on GPU 0 -> CUDA graphs off unless the spec says otherwise
    (vllm("a", gpus=[0]), [vllm("a", gpus=[0]), vllm("b", gpus=[0]), vllm("c", gpus=[0, 1])], ["--enforce-eager"]),
    (vllm("a", gpus=[0], enforce_eager=False),
     [vllm("a", gpus=[0]), vllm("b", gpus=[0]), vllm("c", gpus=[0])], []),
    (vllm("a", gpus=[0]), [vllm("a", gpus=[0]), vllm("b", gpus=[0]), vllm("c", gpus=[1])], []),
])
def test_vllm_argv(spec: ServerSpec, peers: list[ServerSpec] | None, tail: list[str]) -> None:
    cmd = build_command(spec, "/usr/bin/vllm", 8000, peers or [spec])
    head = ["/usr/bin/vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8000"]
    assert list(cmd.argv) == head + tail


def test_cuda_visible_devices_and_env() -> None:
    cmd = build_command(llama(gpus=[1, 0], env={"GGML_X": "1"}), "llama-server", 1)
    assert cmd.env == {"GGML_X": "1", "CUDA_VISIBLE_DEVICES": "1,0"}
    assert "CUDA_VISIBLE_DEVICES" not in build_command(llama(), "llama-server", 1).env


def test_spelling_follows_the_binary() -> None:
    # Newer llama.cpp renamed --draft-max/--draft-min; a binary listing only the new names gets those.
    spec = llama(draft_model="/m/d.gguf", draft_max=8, draft_min=1)
    flags = {"-m", "--host", "--port", "--metrics", "--model-draft", "--spec-draft-n-max", "--spec-draft-n-min"}
    argv = build_command(spec, "llama-server", 9, supported=flags).argv
    assert argv[-6:] == ("--model-draft", "/m/d.gguf", "--spec-draft-n-max", "8", "--spec-draft-n-min", "1")


def test_missing_flag_names_the_field() -> None:
    with pytest.raises(MissingFlag) as err:
        build_command(llama(split_mode="row"), "llama-server", 9, supported={"-m", "--host", "--port", "--metrics"})
    assert err.value.option.field == "split_mode"
    assert err.value.option.spellings == ("-sm", "--split-mode")


def test_optional_flags_only_when_the_binary_has_them() -> None:
    assert "--enable-prompt-tokens-details" not in build_command(vllm(), "vllm", 1, supported={"--host", "--port"}).argv
    argv = build_command(vllm(), "vllm", 1, supported={"--host", "--port", "--enable-prompt-tokens-details"}).argv
    assert argv[-1] == "--enable-prompt-tokens-details"
    # a draft model needs --spec-type on builds that have it (they do not speculate otherwise)
    spec = llama(draft_model="/m/d.gguf")
    new = {"-m", "--host", "--port", "--metrics", "-md", "--spec-type"}
    assert build_command(spec, "llama-server", 9, supported=new).argv[-4:] == ("-md", "/m/d.gguf", "--spec-type",
                                                                               "draft-simple")
    assert build_command(spec, "llama-server", 9, supported=new - {"--spec-type"}).argv[-2:] == ("-md", "/m/d.gguf")


def test_shared_count_treats_empty_gpus_as_all() -> None:
    a, b = vllm("a"), vllm("b", gpus=[3])
    assert gpus_shared_count(a, [a, b]) == 2
    assert gpus_shared_count(b, [a, b]) == 2
    assert gpus_shared_count(vllm("c", gpus=[5]), [b, vllm("c", gpus=[5])]) == 1


def test_sleep_mode_turns_on_vllm_dev_mode() -> None:
    assert build_command(vllm(enable_sleep_mode=True), "vllm", 1).env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert "VLLM_SERVER_DEV_MODE" not in build_command(vllm(), "vllm", 1).env
    # an explicit value in `env` wins
    spec = vllm(enable_sleep_mode=True, env={"VLLM_SERVER_DEV_MODE": "0"})
    assert build_command(spec, "vllm", 1).env["VLLM_SERVER_DEV_MODE"] == "0"
