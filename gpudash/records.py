"""Frozen records: the only shapes that cross layers.

Sources build them, the sampler bundles them into a `Snapshot`, the store writes them as rows and the
TUI draws them. A field a source cannot read is `None` (NA), never a made-up zero. Times are Unix
seconds (float); sizes are bytes; rates are bytes per second unless the name says otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpudash.labels import is_sim_label


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one tick. PCIe rates are payload bytes/s as the source measured them."""

    ts: float
    index: int
    uuid: str
    name: str
    util_pct: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    power_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: int | None = None
    pcie_tx_bps: float | None = None
    pcie_rx_bps: float | None = None
    link_gen: int | None = None
    link_width: int | None = None
    link_gen_max: int | None = None
    link_width_max: int | None = None
    bar1_total: int | None = None
    bar1_used: int | None = None
    throttle: str | None = None  # why clocks are held down ("none", "power cap,thermal"...); None: not reported
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors since boot
    remapped_rows: int | None = None  # rows remapped after uncorrectable errors (A100 and later)
    # PCIe wire bytes (payload plus packet overhead) sent/received since gpudash began counting: NVML's wrapping
    # counters unwrapped to 64 bits (a sim rig: the payload its links moved, having no packet overhead)
    pcie_tx_wire_bytes: int | None = None
    pcie_rx_wire_bytes: int | None = None
    pcie_replay_errors: int | None = None  # PCIe link replays (retransmitted packets) since boot
    clock_events: int | None = None  # NVML's clock-event (throttle) reasons bitmask, gpu/device.CLOCK_EVENT_REASONS
    # Energy (issue 44): joules on a counter that only grows (only its change means anything), and how it was
    # had: "counter" (the driver's, NVML's total energy since it loaded), "integrated" (power over time, where
    # the GPU has no counter), "sim" (a simulated rig's, its simulated power over time)
    energy_j: float | None = None
    energy_source: str | None = None


@dataclass(frozen=True, slots=True)
class GpuProcessSample:
    """GPU memory one process holds on one GPU (maps NVML processes to launched servers)."""

    ts: float
    gpu_index: int
    pid: int
    used_bytes: int | None
    name: str = ""
    server: str | None = None
    sm_pct: float | None = None  # SM utilisation of this process, where the GPU reports it


@dataclass(frozen=True, slots=True)
class HostSample:
    """Host CPU and memory at one tick, plus the processes gpudash launched."""

    ts: float
    cpu_pct: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    numa_nodes: int | None = None
    gpudash_cpu_pct: float | None = None  # % of one core, since the previous tick
    gpudash_rss: int | None = None
    gpudash_pid: int | None = None  # gpudash's own process: its GPU memory is its row in gpu_processes


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """CPU and RSS of one process gpudash launched (a server)."""

    ts: float
    pid: int
    name: str
    cpu_pct: float | None = None
    rss: int | None = None


@dataclass(frozen=True, slots=True)
class EnginePathSample:
    """One transfer-engine path and direction: cumulative counters plus the recent rate.

    `path` names the route, e.g. ``direct:0`` or ``relay:3->0``; `gpu` is the target GPU. `server` names
    the preloaded server whose engine it is (None: gpudash's own engine).
    """

    ts: float
    path: str
    gpu: int
    via: int | None
    direction: str  # "h2d" | "d2h"
    bytes_total: int
    chunks_total: int
    queue_depth: int
    gbps: float
    cpu_s: float
    server: str | None = None


@dataclass(frozen=True, slots=True)
class PoolSample:
    """One memory pool's slab at one tick: its size, and the bytes no shard owns (room to add a shard or
    grow one), which the shard rows alone cannot tell."""

    ts: float
    pool: str
    slab: int
    unassigned: int


@dataclass(frozen=True, slots=True)
class PoolShardSample:
    """One named shard of a memory pool (pinned host pool, or a device pool per GPU)."""

    ts: float
    pool: str
    shard: str
    capacity: int
    used: int
    free: int
    largest_free: int
    free_blocks: int
    fragmentation: float
    failures: int


class ServerState(StrEnum):
    """The one vocabulary of a server's state: the supervisor and attach set it, the store writes its value,
    the exporter and the views read it (`ServerState.read` turns a stored value back into one)."""

    LOADING = "loading"  # launched: its process runs, /health does not say 200 yet
    READY = "ready"  # serving
    RELAUNCHING = "relaunching"  # launched: coming up again with new settings
    SLEEPING = "sleeping"  # vLLM sleep mode: its GPU memory is freed
    BACKOFF = "backoff"  # launched: it crashed and waits to be started again
    CRASHED = "crashed"  # launched: it exited and is not started again
    STOPPED = "stopped"  # launched: stopped by the operator or by gpudash
    ATTACHING = "attaching"  # attached: not read yet
    UNREACHABLE = "unreachable"  # attached: it does not answer
    NOT_A_SERVER = "not a server"  # attached: it answers, but as no kind gpudash knows
    FOUND = "found"  # on the GPUs, not attached (discovery)
    UNKNOWN = "unknown"  # read from a recording: a value this version does not know (nothing live sets it)

    @classmethod
    def read(cls, value: str) -> ServerState:
        """A stored state; "not a llama-server/vLLM" (earlier versions) is NOT_A_SERVER, anything else not
        in the vocabulary is UNKNOWN, so a recording from another version still replays."""
        try:
            return cls(value)
        except ValueError:
            return cls.NOT_A_SERVER if str(value).startswith("not a ") else cls.UNKNOWN

    @property
    def up(self) -> bool:
        """Serving or asleep: the process is there and answers."""
        return self in (ServerState.READY, ServerState.SLEEPING)

    @property
    def running(self) -> bool:
        """A launched server meant to be up (starting, serving, or about to be started again)."""
        return self in (ServerState.LOADING, ServerState.RELAUNCHING, ServerState.READY, ServerState.BACKOFF)


@dataclass(frozen=True, slots=True)
class ServerSample:
    """One inference server at one tick: its state plus what its kind read from it (/metrics, slots)."""

    ts: float
    server: str
    kind: str  # a kind's name (gpudash/launcher/kinds/), "unknown" for an attached server not yet read
    state: ServerState
    pid: int | None = None
    port: int | None = None
    uptime_s: float | None = None
    restarts: int = 0
    tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    ttft_mean_s: float | None = None
    draft_acceptance: float | None = None
    relaunches: int = 0  # re-launches an operator asked for (`restarts` counts those after a crash)
    origin: str = "managed"  # "managed" (gpudash runs it) | "attached" (a `url`: only read) | "found"
    # TTFT quantiles of the requests the server itself saw in the last minute (its histogram's bucket deltas)
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None
    # Hits of a second, host-memory KV cache (vLLM's KV offload): tokens looked up there after the GPU
    # prefix cache missed, and those found
    external_prefix_cache_queries: float | None = None
    external_prefix_cache_hits: float | None = None
    error: str | None = None  # why the last read failed (attached: unreachable, not a server), one line
    url: str | None = None  # where an attached or found server is read (a launched one: host and port)
    # --- what operators page on (issue 34). "window" figures cover the scrapes of the last minute
    # (counters.WINDOW_S); cumulative counters are the server's own, since it started.
    kv_cache_usage_engines: tuple[float, ...] | None = None  # each vLLM DP engine's KV use, 0..1 (kv_cache_usage
    # is the fullest engine's)
    kv_capacity_tokens: float | None = None  # KV cache size in tokens (vLLM cache_config_info; llama-server: its
    # slots' cells)
    preemptions: float | None = None  # cumulative requests preempted (vLLM num_preemptions), a counter
    requests_finished: float | None = None  # cumulative requests finished for any reason (vLLM request_success)
    requests_aborted: float | None = None  # cumulative requests the client aborted (finished_reason="abort")
    requests_failed: float | None = None  # cumulative requests ended by a server error (finished_reason="error")
    requests_rejected: float | None = None  # cumulative admissions refused by a queue limit (admission_rejections)
    requests_corrupted: float | None = None  # cumulative requests with NaN logits (corrupted_requests)
    requests_waiting_capacity: float | None = None  # requests waiting for KV/scheduling capacity now
    ttft_buckets: tuple[tuple[str, float], ...] | None = None  # the server's TTFT histogram as it counts it:
    # ((le, cumulative count), ...), for exporting it as a histogram; with ttft_sum_s and ttft_count
    ttft_sum_s: float | None = None  # cumulative seconds of TTFT observed (the histogram's _sum)
    ttft_count: float | None = None  # cumulative requests whose TTFT was observed (the histogram's _count)
    itl_mean_s: float | None = None  # mean inter-token latency (time per output token), seconds, window
    itl_p90_s: float | None = None  # inter-token latency quantiles, seconds, window (vLLM's histogram)
    itl_p99_s: float | None = None
    queue_mean_s: float | None = None  # time requests waited before running, seconds, window (vLLM)
    queue_p90_s: float | None = None
    queue_p99_s: float | None = None
    e2e_mean_s: float | None = None  # whole-request latency, seconds, window (vLLM)
    e2e_p90_s: float | None = None
    e2e_p99_s: float | None = None
    prefill_mean_s: float | None = None  # mean prompt-processing time per request, seconds, window (vLLM's
    # request_prefill_time; llama-server's counters cannot give one: see prefill_busy)
    rates_coarse: bool | None = None  # tokens_per_s / prompt_tokens_per_s come from counters that move only
    # when a request ends (llama-server --no-slots), not from live progress
    slot_states: tuple[tuple[int, str, int, int], ...] | None = None  # llama-server's slots: (id, "idle" |
    # "prefill" | "decode", tokens held, n_ctx)
    slots_per_decode: float | None = None  # llama-server's mean busy slots per decode call (batching)
    max_sequence_tokens: float | None = None  # llama-server's longest sequence seen, tokens (n_tokens_max)
    # --- issue 43: each figure named for what the server's counters support
    answers: bool | None = None  # a found server: GET /health answered 200 this tick (None: not asked)
    prefill_busy: float | None = None  # share of wall-clock time spent evaluating prompt batches, window
    # (llama-server's prompt_seconds_total: a batch's time once, however many requests share the batch)
    prefix_cache_hit_rate: float | None = None  # prefix-cache hits over lookups, window (the counters' change)
    rate_window_s: float | None = None  # seconds tokens_per_s and prompt_tokens_per_s are measured over
    # The counts those rates are the change of, since the server process started (generated: finished requests'
    # plus what busy slots decoded so far; prompt: computed, prefix-cache hits left out): a tick's tokens are
    # their change, exactly, where a windowed rate times the tick would smear them over RATE_WINDOW_S
    generation_tokens_total: float | None = None
    prompt_tokens_total: float | None = None

    def __post_init__(self) -> None:
        if type(self.state) is not ServerState:  # a plain string is checked against the vocabulary
            object.__setattr__(self, "state", ServerState(self.state))

    @property
    def up(self) -> bool:
        """It answers: serving or asleep, or found on the box with its /health answering 200."""
        return self.state.up or (self.state is ServerState.FOUND and self.answers is True)


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One probe request: what the user feels (client TTFT) and how much came from the prefix cache."""

    ts: float
    server: str
    ttft_s: float | None
    total_s: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None = None
    server_prompt_ms: float | None = None
    ok: bool = True
    error: str | None = None

    @property
    def hit_fraction(self) -> float | None:
        """Share of the prompt served from the prefix cache, or None when unknown."""
        if not self.prompt_tokens or self.cached_tokens is None:
            return None
        return min(1.0, self.cached_tokens / self.prompt_tokens)


@dataclass(frozen=True, slots=True)
class Event:
    """Who changed what from what to what; also launcher happenings (crash, restart)."""

    ts: float
    actor: str  # "keyboard" | "cli" | "supervisor" | "autotune" | ...
    kind: str  # e.g. "engine.knob", "server.split", "server.restart"
    target: str
    old: Any = None
    new: Any = None
    ok: bool = True
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class BuildSample:
    """A llama-server build gpudash runs in the background, at one tick (shown as a progress bar; its
    steps are events, so it is not stored as a table)."""

    ts: float
    what: str  # "cpu" | "cuda sm 90"
    servers: str  # the servers that wait for it (or will be moved onto it), comma-separated
    step: str  # "starting" | "downloading" | "configuring" | "waiting" (for another build) | "compiling"
    started: float  # when the build began (Unix seconds)
    done: int | None = None  # compile steps finished, of `total` (ninja's [n/N], make's percent)
    total: int | None = None


@dataclass(frozen=True, slots=True)
class ServerEnergySample:
    """One server's energy and tokens at one tick (telemetry/server_energy.py), counted since gpudash began
    watching it: joules of the GPUs it runs on (its share of each, `split`), apart while a request was in
    flight (busy) or not (idle), and the tokens it generated and computed (prompt) meanwhile. The per-token
    figures divide all of its energy, busy and idle, by its tokens; "1m" ones cover the last minute."""

    ts: float
    server: str
    gpus: str  # the GPU indices its energy came from, "0,1"
    split: str  # "whole_gpu" (it alone on its GPUs) | "sm_share" (a GPU shared, split by SM utilisation)
    busy_j: float = 0.0
    idle_j: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    j_per_token_1m: float | None = None  # None: no token generated in the window
    j_per_kprompt_1m: float | None = None  # joules per 1,000 prompt tokens, last minute
    unattributed_j: float = 0.0  # of its GPUs' energy, what no split could give (shared, SM use unknown)

    @property
    def energy_j(self) -> float:
        return self.busy_j + self.idle_j

    @property
    def j_per_token(self) -> float | None:
        """Joules per generated token since counting began (None before the first token)."""
        return self.energy_j / self.generation_tokens if self.generation_tokens > 0 else None

    @property
    def j_per_kprompt(self) -> float | None:
        return 1000.0 * self.energy_j / self.prompt_tokens if self.prompt_tokens > 0 else None

    @property
    def tokens_per_kwh(self) -> float | None:
        return self.generation_tokens / (self.energy_j / 3.6e6) if self.energy_j > 0 else None


# Event kinds of driver-reported GPU faults (gpu/xid.py): an Xid, a double-bit ECC error, a lost GPU.
GPU_FAULT_KINDS = ("gpu.xid", "gpu.ecc", "gpu.lost")
# Event kind of each step of a llama-server build gpudash runs (launcher/llama/autobuild.py).
LLAMA_BUILD_KIND = "llama.build"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything seen at one tick. Built by the sampler thread, handed to sinks, never mutated."""

    ts: float
    tick: int
    source: str  # "nvml" | "sim:<profile>" | "replay:<session>"
    gpus: tuple[GpuSample, ...] = ()
    host: HostSample | None = None
    gpu_processes: tuple[GpuProcessSample, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    engine_paths: tuple[EnginePathSample, ...] = ()
    pools: tuple[PoolSample, ...] = ()
    pool_shards: tuple[PoolShardSample, ...] = ()
    servers: tuple[ServerSample, ...] = ()
    requests: tuple[RequestSample, ...] = ()
    events: tuple[Event, ...] = ()
    builds: tuple[BuildSample, ...] = ()
    server_energy: tuple[ServerEnergySample, ...] = ()
    errors: tuple[str, ...] = field(default=())

    @property
    def is_sim(self) -> bool:
        return is_sim_label(self.source)


# Record kinds that the store keeps as tables, keyed by table name.
SAMPLE_TABLES: dict[str, type] = {
    "gpu_samples": GpuSample,
    "gpu_process_samples": GpuProcessSample,
    "host_samples": HostSample,
    "process_samples": ProcessSample,
    "engine_path_samples": EnginePathSample,
    "pool_samples": PoolSample,
    "pool_shard_samples": PoolShardSample,
    "server_samples": ServerSample,
    "requests": RequestSample,
    "events": Event,
    "server_energy_samples": ServerEnergySample,
}


def as_row(record: Any) -> dict[str, Any]:
    """A record as a flat dict (the store's row shape, minus the session id)."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
