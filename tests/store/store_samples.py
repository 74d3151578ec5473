"""Snapshots with every record kind and every field set, built directly (no sampler needed)."""

from __future__ import annotations


from gpudash.records import (Event, EnginePathSample, GpuProcessSample, GpuSample, HostSample, PoolSample,
                             PoolShardSample, ProcessSample, RequestSample, ServerEnergySample, ServerSample, Snapshot)

SOURCE = "sim:8xh20"


def full_snapshot(tick: int, n_gpus: int = 8, ts0: float = 1_700_000_000.0) -> Snapshot:
    ts = ts0 + tick * 0.5
    gpus = tuple(GpuSample(ts, i, f"GPU-{i:04d}", "NVIDIA H20", 12.5 + i, 10 * 2**30 + i, 96 * 2**30, 250.5, 41.0,
                           1755, 1.5e9 * i, 2.5e9, 5, 16 - (i == 3) * 8, 5, 16, 128 * 2**30, 2**20 * i)
                 for i in range(n_gpus))
    return Snapshot(
        ts=ts, tick=tick, source=SOURCE, gpus=gpus,
        host=HostSample(ts, 33.3, 64 * 2**30, 512 * 2**30, 2, 0.8, 150 * 2**20),
        gpu_processes=(GpuProcessSample(ts, 0, 4242, 9 * 2**30, "llama-server", "chat"),
                       GpuProcessSample(ts, 1, 4243, None, "python", None)),
        processes=(ProcessSample(ts, 4242, "llama-server", 180.0, 2**31),),
        engine_paths=(EnginePathSample(ts, "direct:0", 0, None, "h2d", 10**9 * tick, 40 * tick, 2, 49.5, 0.25),
                      EnginePathSample(ts, "relay:3->0", 0, 3, "h2d", 10**8 * tick, 4 * tick, 1, 12.0, 0.01)),
        pools=(PoolSample(ts, "pinned", 2**31, 2**30 - 2**20 * tick),),
        pool_shards=(PoolShardSample(ts, "pinned", "numa0", 2**30, 2**29, 2**29, 2**28, 3, 0.5, tick),),
        servers=(ServerSample(ts, "chat", "llama.cpp", "ready", 4242, 8080, 12.0, 1, 55.5, 900.0, 1.0, 0.0,
                              0.42, 100.0, 60.0, 0.08, 0.7),),
        requests=(RequestSample(ts, "chat", 0.081, 0.4, 256, 128, 16, 20.5, True, None),
                  RequestSample(ts, "chat", None, None, 256, None, None, None, False, "HTTP 503")),
        events=(Event(ts, "keyboard", "engine.knob", "outstanding", 2, 4),
                Event(ts, "cli", "server.split", "chat", [1, 1], {"ratios": [2, 3]}, False, "GPU 1 too small")),
        errors=("host: timed out after 0.5 s",) if tick % 3 == 1 else (),
        server_energy=(ServerEnergySample(ts, "chat", "0", "whole_gpu", 120.5 * tick, 30.0, 40.0 * tick, 900.0,
                                          3.0 if tick else None, None, 0.0),),
    )
