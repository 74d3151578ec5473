"""Per-model VRAM shares: who holds how much of each GPU against the share it was given.

A server's share is a fraction of each of its GPUs' memory. vLLM enforces it itself
(`--gpu-memory-utilization`). llama.cpp has no such flag, so gpudash enforces a budget through the
flags it has: `llama_budget()` reads the model's shape from its GGUF file and picks `-ngl` (layers on
the GPU) and `-c` (context, hence KV cache) so that weights + KV cache + a fixed overhead fit in
share * VRAM: all layers with the wanted context if that fits, else all layers with a shorter
context (not below `min_ctx`), else fewer layers at `min_ctx`, placed as llama.cpp places them
(`gpu_part`); the llama.cpp kind's `budget_spec()` sets those two fields. What a server really holds is
watched from NVML's per-process memory; `share_warnings()` flags a server above its share.

Everything here is a pure function over a Snapshot (or numbers) and the server specs, returning
records the TUI and `gpudash doctor` show.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpudash.config import ServerSpec
from gpudash.records import Snapshot

MiB = 1 << 20
# CUDA context (300-500 MiB on recent drivers, charged to the process by NVML) plus llama.cpp's compute
# buffers; calibrate with `gpudash bench share` on the target box and pass overhead_bytes.
DEFAULT_OVERHEAD = 512 * MiB
# Context llama.cpp's own --fit never goes below; the budget shortens the context to this before
# moving layers to the CPU.
MIN_CTX = 4096
# Bytes per element of the KV cache types llama.cpp accepts (-ctk/-ctv); block formats include scales.
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                 "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}
WarningKind = Literal["oversubscribed", "low_free_at_start", "over_share"]


# ---- accounting -------------------------------------------------------------------------------
def parse_share(text: str | float, what: str = "memory share") -> float:
    """A share ('0.45', or a number) as a float in (0, 1]; ValueError naming `what` and the fix. The one
    check behind the TUI's share form, `gpudash bench share --shares` and Controller's SetShare."""
    try:
        share = float(text)
    except ValueError:
        raise ValueError(f"{what} {str(text).strip()!r} is not a number; write a fraction of each GPU's memory "
                         "like 0.45") from None
    if not 0 < share <= 1:
        raise ValueError(f"{what} {share:g} is outside (0, 1]; a share is a fraction of each GPU's memory")
    return share


def share_and_origin(spec: ServerSpec) -> tuple[float | None, str]:
    """The fraction of each GPU the server may hold and where it comes from, as its kind's spec says (vLLM:
    gpu_memory_utilization, else share, else vLLM's default); (None, "") when none is set."""
    return spec.memory_share()


def effective_share(spec: ServerSpec) -> float | None:
    """The fraction of each GPU the server may hold (see share_and_origin)."""
    return share_and_origin(spec)[0]


def server_gpus(spec: ServerSpec, gpu_indices: Iterable[int]) -> list[int]:
    """The GPUs a server uses: its `gpus`, or every GPU when empty."""
    return list(spec.gpus) if spec.gpus else sorted(gpu_indices)


@dataclass(frozen=True, slots=True)
class ShareUse:
    """One server on one GPU: what NVML says it holds (None: not readable) against its budget."""

    server: str
    gpu: int
    share: float | None
    total: int | None     # the GPU's memory
    budget: int | None    # share * total
    used: int | None

    @property
    def used_fraction(self) -> float | None:
        """Used memory as a fraction of the whole GPU (comparable with `share`)."""
        return None if self.used is None or not self.total else self.used / self.total


@dataclass(frozen=True, slots=True)
class ShareWarning:
    kind: WarningKind
    gpu: int
    servers: tuple[str, ...]
    message: str


def share_usage(snapshot: Snapshot, specs: Sequence[ServerSpec]) -> tuple[ShareUse, ...]:
    """Used vs share for every (server, GPU) pair, from the snapshot's GPU and per-process samples."""
    totals = {g.index: g.mem_total for g in snapshot.gpus}
    held: dict[tuple[str, int], int] = {}
    readable: dict[tuple[str, int], bool] = {}
    for p in snapshot.gpu_processes:
        if p.server is None:
            continue
        key = (p.server, p.gpu_index)
        readable[key] = readable.get(key, True) and p.used_bytes is not None
        held[key] = held.get(key, 0) + (p.used_bytes or 0)
    seen = {p.gpu_index for p in snapshot.gpu_processes}
    out = []
    for spec in specs:
        share = effective_share(spec)
        for gpu in server_gpus(spec, totals):
            key = (spec.name, gpu)
            total = totals.get(gpu)
            if key in held:
                used: int | None = held[key] if readable[key] else None
            else:  # no process of this server on the GPU: 0 if NVML listed processes there, else unknown
                used = 0 if gpu in seen else None
            budget = int(share * total) if share is not None and total else None
            out.append(ShareUse(spec.name, gpu, share, total, budget, used))
    return tuple(out)


def shares_per_gpu(specs: Sequence[ServerSpec], gpu_indices: Iterable[int]) -> dict[int, list[tuple[ServerSpec, float]]]:
    """Each GPU's servers that declare a share, with that share."""
    gpus = list(gpu_indices)
    per_gpu: dict[int, list[tuple[ServerSpec, float]]] = {}
    for spec in specs:
        share = effective_share(spec)
        if share is not None:
            for gpu in server_gpus(spec, gpus):
                per_gpu.setdefault(gpu, []).append((spec, share))
    return per_gpu


def oversubscription_warnings(specs: Sequence[ServerSpec], gpu_indices: Iterable[int]) -> list[ShareWarning]:
    """GPUs whose servers' shares add up to more than 1 (the last one to start cannot get its share)."""
    out = []
    for gpu, held in sorted(shares_per_gpu(specs, gpu_indices).items()):
        total = sum(share for _, share in held)
        if total > 1 + 1e-9:
            parts = " + ".join(f"{spec.name} {share:g}" for spec, share in held)
            out.append(ShareWarning("oversubscribed", gpu, tuple(spec.name for spec, _ in held),
                                    f"GPU {gpu}: shares add up to {total:.2f} ({parts}); lower them to 1 or less "
                                    f"or the last server to start cannot get its share"))
    return out


def over_share_warnings(usage: Iterable[ShareUse], tolerance: float = 0.01) -> list[ShareWarning]:
    """Servers holding more than their budget (by more than `tolerance` of it) on a GPU."""
    out = []
    for u in usage:
        if u.budget is not None and u.used is not None and u.used > u.budget * (1 + tolerance):
            out.append(ShareWarning("over_share", u.gpu, (u.server,),
                                    f"{u.server} holds {u.used / MiB:.0f} MiB on GPU {u.gpu}, above its share "
                                    f"{u.share:g} ({u.budget / MiB:.0f} MiB); lower its context/layers or raise "
                                    f"its share"))
    return out


def start_warnings(snapshot: Snapshot, spec: ServerSpec) -> list[ShareWarning]:
    """Before (or just as) `spec` starts: GPUs whose free memory, plus what the server already holds
    there, is below its share. Call it before a start; share_warnings() does for start events."""
    share = effective_share(spec)
    if share is None:
        return []
    mine: dict[int, int] = {}
    for p in snapshot.gpu_processes:
        if p.server == spec.name and p.used_bytes:
            mine[p.gpu_index] = mine.get(p.gpu_index, 0) + p.used_bytes
    gpus = {g.index: g for g in snapshot.gpus}
    out = []
    for gpu in server_gpus(spec, gpus):
        g = gpus.get(gpu)
        if g is None or g.mem_total is None or g.mem_used is None:
            continue
        free = g.mem_total - g.mem_used + mine.get(gpu, 0)
        want = int(share * g.mem_total)
        if free < want:
            out.append(ShareWarning("low_free_at_start", gpu, (spec.name,),
                                    f"{spec.name} starts with {free / MiB:.0f} MiB free on GPU {gpu}, below its "
                                    f"share {share:g} ({want / MiB:.0f} MiB); stop another server there or lower "
                                    f"the share"))
    return out


def share_warnings(snapshot: Snapshot, specs: Sequence[ServerSpec], tolerance: float = 0.01) -> tuple[ShareWarning, ...]:
    """Every share warning for one tick: oversubscribed GPUs, servers over their share, and servers
    whose start/restart event is in this tick while free memory was below their share."""
    by_name = {s.name: s for s in specs}
    out = oversubscription_warnings(specs, (g.index for g in snapshot.gpus))
    out += over_share_warnings(share_usage(snapshot, specs), tolerance)
    for ev in snapshot.events:
        if ev.kind in ("server.start", "server.restart") and ev.ok and ev.target in by_name:
            out += start_warnings(snapshot, by_name[ev.target])
    return tuple(out)


# ---- llama.cpp budget ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the budget needs from a GGUF model: weight bytes per repeating layer, the output tensors
    (llama.cpp offloads them first: gpu_part), and the KV cache geometry (KV heads per layer: models such
    as OpenELM or Gemma 3n vary them by layer). The input embeddings are not here: they stay on the CPU."""

    layers: int
    layer_bytes: tuple[int, ...]
    output_bytes: int
    heads_kv: tuple[int, ...]
    key_length: int
    value_length: int
    context_train: int

    def kv_bytes(self, tokens: int, layers: int, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
        """KV cache bytes for `tokens` of context over the last `layers` layers (llama.cpp offloads the
        last layers first)."""
        per_head = self.key_length * KV_TYPE_BYTES[cache_type_k] + self.value_length * KV_TYPE_BYTES[cache_type_v]
        heads = sum(self.heads_kv[self.layers - layers:]) if layers else 0
        return int(per_head * heads * tokens)


class DamagedModel(ValueError):
    """A file that begins as GGUF but whose header, metadata or tensors cannot be the model they claim (a
    count past the file's end, a layer count of 10^8): one sentence naming the file and the field."""


GGUF_MAGIC = b"GGUF"
# What any real model stays within (the largest have ~130 blocks, 128 heads, 10M tokens of context): a
# value past these is a damaged or crafted file, and is refused before anything is sized by it.
LIMITS = {"block_count": 4096, "head_count": 1 << 16, "head_count_kv": 1 << 16, "embedding_length": 1 << 20,
          "key_length": 1 << 16, "value_length": 1 << 16, "context_length": 1 << 26}
_BLOCK = re.compile(r"blk\.([0-9]{1,9})\.", re.ASCII)


def _per_layer(value: object, layers: int, key: str, path: str | Path) -> tuple[int, ...]:
    """A GGUF hyperparameter as one int per layer: a scalar repeats, an array must have one per layer."""
    if isinstance(value, (list, tuple)):
        if len(value) != layers or not all(isinstance(v, int) for v in value):
            raise ValueError(f"{path}: GGUF key {key!r} is an array of {len(value)} values for {layers} layers; "
                             "this model file is not one gpudash can budget, so remove `share` from its "
                             "[[servers]] entry")
        values = tuple(int(v) for v in value)
    elif isinstance(value, int):
        values = (value,) * layers
    else:
        raise ValueError(f"{path}: GGUF key {key!r} holds {value!r}, not a number; is this a llama.cpp model file?")
    _within(path, key, *values)
    return values


def _within(path: str | Path, key: str, *values: int) -> None:
    """DamagedModel unless every value of `key` lies in 0..LIMITS[its last part]."""
    hi = LIMITS[key.rsplit(".", 1)[-1]]
    if bad := next((v for v in values if not 0 <= v <= hi), None):
        raise DamagedModel(f"{path}: GGUF key {key!r} is {bad}, outside 0..{hi}; the file is damaged or not a "
                           "model llama.cpp can load")


def _reader(path: str | Path):
    """The gguf package's reader over `path`, or ValueError in one sentence: not GGUF at all (no magic), or
    DamagedModel when its header or metadata runs past the end of the file (a truncated file, or a count
    or length far too large: the reader would index past its memory map)."""
    from gguf import GGUFReader

    try:
        with open(path, "rb") as f:
            magic = f.read(len(GGUF_MAGIC))
        if magic != GGUF_MAGIC:
            raise ValueError(f"{path} is not a readable GGUF model file (it does not begin with GGUF's magic); point "
                             "`model` at a .gguf file")
        return GGUFReader(str(path))
    except OSError as e:
        raise ValueError(f"{path} is not a readable GGUF model file ({e.strerror or e}); point `model` at a "
                         ".gguf file") from None
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
        if isinstance(e, ValueError) and str(e).startswith(str(path)):
            raise
        size = Path(path).stat().st_size
        raise DamagedModel(f"{path}: its GGUF header or metadata runs past the end of the file ({size} bytes): it "
                           "is truncated, or a tensor count, key count or string length in it is too large") from None


def model_shape(path: str | Path) -> ModelShape:
    """Read a GGUF file's shape with the gguf package (ValueError naming what is missing or unusable;
    DamagedModel for a file whose fields its size or any real model's limits rule out, before anything is
    sized by them).

    A model without `output.weight` ties its output to the token embeddings: llama.cpp then puts a copy
    of `token_embd` on the output device, so it counts with the output tensors.
    """
    reader = _reader(path)

    def raw(key: str) -> object:
        f = reader.get_field(key)
        return None if f is None else f.contents()

    def field(key: str, default: int | None = None) -> int:
        v = raw(key)
        if v is None:
            if default is None:
                raise ValueError(f"{path}: GGUF key {key!r} is missing; is this a llama.cpp model file?")
            return default
        if not isinstance(v, int):
            raise ValueError(f"{path}: GGUF key {key!r} holds {type(v).__name__} {v!r}, not a number; is this a "
                             "llama.cpp model file?")
        _within(path, key, v)
        return v

    arch = reader.get_field("general.architecture")
    if arch is None:
        raise ValueError(f"{path}: no general.architecture key; not a GGUF model file")
    a = arch.contents()
    layers = field(f"{a}.block_count")
    heads_raw = raw(f"{a}.attention.head_count")
    if heads_raw is None:
        raise ValueError(f"{path}: GGUF key '{a}.attention.head_count' is missing; is this a llama.cpp model file?")
    heads = _per_layer(heads_raw, layers, f"{a}.attention.head_count", path)
    kv_raw = raw(f"{a}.attention.head_count_kv")
    heads_kv = heads if kv_raw is None else _per_layer(kv_raw, layers, f"{a}.attention.head_count_kv", path)
    if not 1 <= layers <= len(reader.tensors):  # every block has tensors of its own
        raise DamagedModel(f"{path}: GGUF key '{a}.block_count' is {layers}, but the file holds "
                           f"{len(reader.tensors)} tensors; the file is damaged or not a model llama.cpp can load")
    head_dim = field(f"{a}.embedding_length") // max(heads[0] or max(heads), 1)  # llama.cpp: layer 0's heads
    per_layer = [0] * layers
    output = 0
    names = {t.name for t in reader.tensors}
    for t in reader.tensors:
        if t.name.startswith("blk."):
            block = _BLOCK.match(t.name)
            if block is None or int(block[1]) >= layers:
                raise DamagedModel(f"{path}: tensor {t.name!r} names a block past the {layers} of "
                                   f"'{a}.block_count'; the file is damaged or not a model llama.cpp can load")
            per_layer[int(block[1])] += int(t.n_bytes)
        elif t.name != "token_embd.weight":  # input embeddings stay on the CPU in llama.cpp
            output += int(t.n_bytes)
        elif "output.weight" not in names:  # tied: the output layer is a copy of the embeddings
            output += int(t.n_bytes)
    return ModelShape(layers, tuple(per_layer), output, heads_kv, field(f"{a}.attention.key_length", head_dim),
                      field(f"{a}.attention.value_length", head_dim), field(f"{a}.context_length", MIN_CTX))


@dataclass(frozen=True, slots=True)
class LlamaBudget:
    """The -ngl / -c that keep a llama.cpp server inside `budget_bytes`; `estimate_bytes` is what
    the model is expected to hold on the GPU(s) with them; `note` says what was given up."""

    n_gpu_layers: int
    ctx_size: int
    budget_bytes: int
    estimate_bytes: int
    note: str

    def argv(self) -> list[str]:
        return ["-ngl", str(self.n_gpu_layers), "-c", str(self.ctx_size)]


def gpu_part(shape: ModelShape, ngl: int) -> tuple[int, bool]:
    """(repeating blocks on the GPU, whether the output layer is) for llama.cpp's -ngl `ngl`, as
    src/llama-model.cpp places them: layers i_gpu_start = max(n_layer + 1 - ngl, 0) up to n_layer go to
    the GPU, where "layer" n_layer is the output layer. So the output layer goes first (any ngl >= 1),
    then the last ngl - 1 blocks; ngl = n_layer leaves block 0 on the CPU, only n_layer + 1 offloads all."""
    n = shape.layers
    ngl = max(0, min(ngl, n + 1))
    return (max(0, ngl - 1), ngl >= 1)


def gpu_bytes(shape: ModelShape, ngl: int, tokens: int, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
    """Weights and KV cache llama.cpp puts on the GPU(s) at -ngl `ngl` and `tokens` of context (the input
    embeddings stay on the CPU; each block's KV cache goes with the block)."""
    blocks, output = gpu_part(shape, ngl)
    weights = sum(shape.layer_bytes[shape.layers - blocks:]) if blocks else 0
    return weights + (shape.output_bytes if output else 0) + shape.kv_bytes(tokens, blocks, cache_type_k, cache_type_v)


def llama_budget(shape: ModelShape, budget_bytes: int, *, ctx_wanted: int | None = None, ngl_max: int | None = None,
                 cache_type_k: str = "f16", cache_type_v: str = "f16", overhead_bytes: int = DEFAULT_OVERHEAD,
                 min_ctx: int = MIN_CTX) -> LlamaBudget:
    """Largest offload that fits `budget_bytes`: every layer + wanted context, else every layer + the
    longest context >= min_ctx that fits (multiple of 256), else the largest -ngl at min_ctx, placed as
    llama.cpp places it (gpu_part: the output layer first, then the last blocks)."""
    for t in (cache_type_k, cache_type_v):
        if t not in KV_TYPE_BYTES:
            raise ValueError(f"KV cache type {t!r} is unknown; use one of {', '.join(KV_TYPE_BYTES)}")
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    ctx = ctx_wanted or shape.context_train
    min_ctx = min(min_ctx, ctx)
    n = shape.layers
    cap = n + 1 if ngl_max is None or ngl_max < 0 else min(n + 1, ngl_max)
    avail = budget_bytes - overhead_bytes

    def need(ngl: int, tokens: int) -> int:
        return gpu_bytes(shape, ngl, tokens, cache_type_k, cache_type_v)

    def result(ngl: int, tokens: int, note: str) -> LlamaBudget:
        return LlamaBudget(ngl, tokens, budget_bytes, overhead_bytes + need(ngl, tokens), note)

    if avail <= 0:
        return result(0, ctx, f"the budget ({budget_bytes / MiB:.0f} MiB) is below the overhead "
                              f"({overhead_bytes / MiB:.0f} MiB): every layer stays on the CPU")
    if need(cap, ctx) <= avail:
        return result(cap, ctx, "fits" if cap == n + 1 else f"fits with the configured -ngl {cap}")
    if need(cap, min_ctx) <= avail:
        blocks = gpu_part(shape, cap)[0]
        per_tok = shape.kv_bytes(1 << 20, blocks, cache_type_k, cache_type_v) / (1 << 20)
        fit = int((avail - need(cap, 0)) / per_tok) if per_tok else ctx
        tokens = max(min_ctx, min(ctx, fit // 256 * 256))
        return result(cap, tokens, f"context cut from {ctx} to {tokens} tokens to fit the share")
    ngl = max((k for k in range(cap + 1) if need(k, min_ctx) <= avail), default=0)
    blocks, output = gpu_part(shape, ngl)
    return result(ngl, min_ctx, f"-ngl {ngl}: {blocks} of {n} blocks{' and the output layer' if output else ''} "
                                f"on the GPU at {min_ctx} tokens of context; the rest run on the CPU")


