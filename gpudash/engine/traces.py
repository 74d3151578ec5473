"""Alloc/free traces that MemoryPool.replay runs: the recorded format (.npz) and a generator of
multi-tenant KV-cache traces, for the pool benchmarks and tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpudash.engine.errors import EngineArgumentError


@dataclass(frozen=True)
class Trace:
    """A recorded alloc/free sequence: op 0 allocates size[i] bytes in shards[shard[i]] into slot[i],
    op 1 frees slot[i]. Saved as .npz so benchmarks replay exactly the same operations."""

    op: np.ndarray      # int32
    shard: np.ndarray   # int32 index into `shards`
    size: np.ndarray    # uint64
    slot: np.ndarray    # uint32
    shards: tuple[str, ...]
    capacity: dict[str, int]  # shard capacities the trace was made for
    align: np.ndarray | None = None  # uint64 per op (0: the granule), or None

    def __len__(self) -> int:
        return len(self.op)

    def save(self, path: str | Path) -> None:
        extra = {} if self.align is None else {"align": self.align}
        np.savez_compressed(path, op=self.op, shard=self.shard, size=self.size, slot=self.slot,
                            shards=np.array(self.shards), capacity=np.array([self.capacity[s] for s in self.shards],
                                                                            dtype=np.uint64), **extra)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        with np.load(path) as z:
            names = tuple(str(s) for s in z["shards"])
            return cls(z["op"], z["shard"], z["size"], z["slot"], names,
                       dict(zip(names, (int(c) for c in z["capacity"]))), z["align"] if "align" in z else None)


# KV bytes per token of a few model shapes (layers * 2 (K and V) * kv heads * head dim * 2 bytes, f16).
KV_BYTES_PER_TOKEN = {"0.5b": 24 * 2 * 2 * 64 * 2, "7b": 28 * 2 * 4 * 128 * 2, "32b": 64 * 2 * 8 * 128 * 2}


def kv_tenant_trace(n_ops: int, *, tenants: tuple[str, ...] = ("0.5b", "7b", "32b", "7b"),
                    capacity: int = 512 << 20, block_tokens: int = 16, max_blocks: int = 64,
                    fill: float = 0.85, aligned: bool = False, seed: int = 0) -> Trace:
    """Several tenants (model shapes from KV_BYTES_PER_TOKEN) each holding KV caches in their own shard:
    a sequence's cache is 1..max_blocks blocks of `block_tokens` tokens, lives a random while, and is
    freed in random order. Each tenant aims at `fill` of its shard, so allocations sometimes fail."""
    rng = np.random.default_rng(seed)
    names = tuple(f"t{i}-{m}" for i, m in enumerate(tenants))
    block = [KV_BYTES_PER_TOKEN[m] * block_tokens for m in tenants]
    op = np.empty(n_ops, np.int32)
    shard = np.empty(n_ops, np.int32)
    size = np.zeros(n_ops, np.uint64)
    slot = np.empty(n_ops, np.uint32)
    align = np.zeros(n_ops, np.uint64) if aligned else None
    who = rng.integers(0, len(tenants), n_ops)
    nblocks = rng.integers(1, max_blocks + 1, n_ops)
    coin = rng.random(n_ops)
    pick = rng.random(n_ops)
    aligns = rng.choice([0, 512, 4096, 65536], n_ops)
    live: list[list[tuple[int, int]]] = [[] for _ in tenants]   # per tenant: (slot, bytes)
    held = [0] * len(tenants)
    spare: list[int] = []
    next_slot = 0
    for i in range(n_ops):
        t = int(who[i])
        want = int(nblocks[i]) * block[t]
        grow = not live[t] or (held[t] + want <= fill * capacity and coin[i] < 0.55) or coin[i] < 0.02
        shard[i] = t
        if grow:
            s = spare.pop() if spare else next_slot
            next_slot += s == next_slot
            op[i], size[i], slot[i] = 0, want, s
            if align is not None:
                align[i] = aligns[i]
            live[t].append((s, want))
            held[t] += want
        else:
            j = int(pick[i] * len(live[t]))
            live[t][j], live[t][-1] = live[t][-1], live[t][j]
            s, b = live[t].pop()
            op[i], slot[i] = 1, s
            held[t] -= b
            spare.append(s)
    return Trace(op, shard, size, slot, names, {n: capacity for n in names}, align)


def replay_columns(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The trace's columns as the C types replay reads, after checking lengths and values (a bad
    trace file must give an error, not a read past an array)."""
    n = len(trace.op)
    cols = {"op": trace.op, "shard": trace.shard, "size": trace.size, "slot": trace.slot}
    if trace.align is not None:
        cols["align"] = trace.align
    for name, col in cols.items():
        if np.ndim(col) != 1 or len(col) != n:
            raise EngineArgumentError(f"trace column {name!r} has shape {np.shape(col)}; every column must be "
                                      f"1-D with {n} entries (one per op)")
    if n and not np.isin(trace.op, (0, 1)).all():
        raise EngineArgumentError("trace column 'op' must hold only 0 (alloc) and 1 (free)")
    if n and (trace.shard.min() < 0 or trace.shard.max() >= len(trace.shards)):
        raise EngineArgumentError(f"trace column 'shard' must index its {len(trace.shards)} shard names")
    if n and (trace.slot.min() < 0 or trace.slot.max() >= 1 << 31):
        raise EngineArgumentError("trace column 'slot' must hold slot numbers in [0, 2**31)")
    as_c = {"op": np.int32, "size": np.uint64, "slot": np.uint32, "align": np.uint64}
    out = [np.ascontiguousarray(cols[k], dtype=as_c[k]) if k in cols else None for k in ("op", "size", "slot", "align")]
    return out[0], out[1], out[2], out[3]
