/* gpudash transfer engine: the one C ABI that gpudash/engine/_native.py loads with ctypes.
 *
 * Every function returns GE_OK (0) or an error code: negative codes are the engine's own
 * (GE_E*), codes >= GE_CUDA_BASE are GE_CUDA_BASE + a CUresult; ge_strerror() names both.
 * Python builds the named results from the raw structs below; nothing here allocates for the caller.
 */
#ifndef GPUDASH_ENGINE_H
#define GPUDASH_ENGINE_H

#include <stdint.h>

#include "abi_version.h" /* GE_ABI_VERSION, generated from gpudash/engine/_native.py */

#ifdef __cplusplus
extern "C" {
#endif

enum {
  GE_OK = 0,
  GE_EINVAL = -1,    /* bad argument (size, knob, direction) */
  GE_ENOMEM = -2,    /* host or device allocation failed */
  GE_ENODEV = -3,    /* no such GPU */
  GE_EFREED = -4,    /* pointer is not a live gpudash/engine/device allocation */
  GE_ERANGE = -5,    /* buffer smaller than the copy */
  GE_EPATH = -6,     /* every path able to carry the copy failed */
  GE_ETIMEOUT = -7,  /* wait timed out; the copy is still running */
  GE_ENOTSUP = -8,   /* not supported by this backend */
  GE_ECLOSED = -9,   /* engine closed */
  GE_ENOCUDA = -10,  /* libcuda.so.1 could not be loaded or initialised */
  GE_EBUSY = -11,    /* resource in use by copies in flight */
  GE_CUDA_BASE = 10000
};

enum { GE_H2D = 0, GE_D2H = 1 };
enum { GE_MEM_PAGEABLE = 0, GE_MEM_PINNED = 1, GE_MEM_DEVICE = 2 };
/* How the host side of a copy is reached: directly (pinned or registered) or through the staging ring. */
enum { GE_HOST_DIRECT = 0, GE_HOST_STAGED = 1 };
/* OR into host_mode: the single direct path whatever the size (no multipath; one chunk unless staged). */
#define GE_COPY_DIRECT_ONLY 0x100

typedef struct {
  uint64_t h2d_chunk_bytes;
  uint64_t d2h_chunk_bytes;
  uint64_t h2d_fallback_bytes;
  uint64_t d2h_fallback_bytes;
  int32_t outstanding;
  int32_t direct_first;
  int32_t staging_threads;
  int32_t reserved;
} ge_knobs;

typedef struct {
  int32_t gpu;        /* GPU whose memory the copy reads or writes */
  int32_t via;        /* GPU whose host link carries the bytes (== gpu for the direct path) */
  int32_t direction;  /* GE_H2D | GE_D2H */
  int32_t failed;     /* path marked failed after an error (sim fault injection or CUDA error) */
  uint64_t bytes;
  uint64_t chunks;
  int32_t queue_depth;
  int32_t reserved;
  double gbps;        /* recent rate, 10**9 B per second of the backend clock (sim time on sim) */
  double cpu_s;       /* thread CPU seconds spent issuing and completing this path's chunks */
} ge_path_stats;

typedef struct {
  int32_t gpu;
  int32_t reserved;
  uint64_t h2d_bytes;  /* payload bytes over this GPU's own host link, host -> GPU */
  uint64_t d2h_bytes;
  double h2d_gbps;     /* current link model bandwidth (sim); 0 when unknown (cuda) */
  double d2h_gbps;
} ge_link_stats;

typedef struct ge_engine ge_engine;

int ge_abi_version(void);
const char *ge_strerror(int code);

/* sim: n GPUs; link_gbps[n] per-direction payload rate of each GPU's host link, latency_us[n],
 * peer_gbps[n*n] (0: no peer path), nvlink_gbps (0: peer rates are per pair, else per-GPU NVLink
 * ingress/egress cap), time_scale: real seconds per simulated second. */
int ge_create_sim(int n, const double *link_gbps, const double *latency_us, const double *peer_gbps,
                  double nvlink_gbps, double time_scale, const ge_knobs *knobs, ge_engine **out);
int ge_create_cuda(const ge_knobs *knobs, ge_engine **out);
/* Stops the engine and frees it. Queued copies fail with GE_ECLOSED, chunks already on a path land;
 * callers blocked in ge_wait, ge_finish or ge_copy_sync then return, and the engine is freed once they
 * have left. Any other call racing with ge_destroy, and every call after it, uses freed memory: keeping
 * e out of use from then on is the caller's job (gpudash/engine/transfer.py does it with a call gate). */
void ge_destroy(ge_engine *e);

int ge_num_gpus(ge_engine *e);
int ge_device_name(ge_engine *e, int gpu, char *buf, int cap);
int ge_peer_gbps(ge_engine *e, int a, int b, double *gbps); /* 0: none; <0: P2P without a known rate */
double ge_now(ge_engine *e); /* backend clock in seconds (sim time on sim) */

/* GE_EINVAL for a knob out of range, GE_ENOMEM when an engine pool cannot hold one chunk per relay
 * path (see ge_engine_pool); either way nothing changes. */
int ge_set_knobs(ge_engine *e, const ge_knobs *k);
int ge_get_knobs(ge_engine *e, ge_knobs *k);

/* The engine's own memory pools (gpudash_pool.h), owned and freed by the engine. which = -1: the pinned
 * host pool, one shard holding the staging ring's slots; which = g: GPU g's device pool, one shard
 * holding the relay buffers of the relay paths through g (*pool NULL when none runs through it).
 * Chunks take blocks as they are issued and return them as they land. A shard is sized for
 * `outstanding` chunks on each relay path (all the ring's slots) and grows on ge_set_knobs, up to its
 * pool's size; ge_set_knobs fails with GE_ENOMEM, changing nothing, when a pool cannot hold even one
 * chunk per relay path. floor: the shard capacity the engine relies on (the largest it grew to). */
struct gp_pool;
int ge_engine_pool(ge_engine *e, int which, struct gp_pool **pool, int *shard, uint64_t *base, uint64_t *size,
                   uint64_t *granule, uint64_t *floor);
/* Shard bytes engine pool `which` needs at the least under knobs k (one chunk per relay path). */
int ge_pool_need(ge_engine *e, const ge_knobs *k, int which, uint64_t *need);

int ge_num_paths(ge_engine *e);
int ge_stats(ge_engine *e, ge_path_stats *paths, int path_cap, ge_link_stats *links, int link_cap);

/* sim only */
int ge_sim_set_link(ge_engine *e, int gpu, double gbps);
int ge_sim_fail_path(ge_engine *e, int gpu, int via, int direction, int fail);
/* sim: Python-owned memory standing in for device (GE_MEM_DEVICE, gpu) or pinned (GE_MEM_PINNED) memory;
 * the caller keeps it alive until ge_sim_untrack, so views of it never dangle. */
int ge_sim_track(ge_engine *e, uint64_t ptr, uint64_t nbytes, int kind, int gpu);
int ge_sim_untrack(ge_engine *e, uint64_t ptr, int kind);

int ge_alloc_device(ge_engine *e, int gpu, uint64_t nbytes, uint64_t *ptr);
int ge_free_device(ge_engine *e, uint64_t ptr);
int ge_alloc_host(ge_engine *e, uint64_t nbytes, uint64_t *ptr); /* pinned */
int ge_free_host(ge_engine *e, uint64_t ptr);
/* kind: GE_MEM_*; gpu: device ordinal for device memory; avail: bytes valid from ptr (0: unknown) */
int ge_classify(ge_engine *e, uint64_t ptr, int *kind, int *gpu, uint64_t *avail);
/* The same, packed for the per-copy hot path: kind * 256 + (gpu + 1), or a negative error code. */
int ge_kind(ge_engine *e, uint64_t ptr);
int ge_host_register(ge_engine *e, uint64_t ptr, uint64_t nbytes);
int ge_host_unregister(ge_engine *e, uint64_t ptr);

/* What to copy: filled once per copy plan (Python memoizes plans), so a copy call passes a few
 * arguments instead of nine (each ctypes argument costs ~0.15 us, and a small copy ~10 us). */
typedef struct {
  int32_t direction; /* GE_H2D | GE_D2H */
  int32_t gpu;       /* GPU whose memory is read or written */
  uint64_t dst, src, nbytes;
} ge_copy_desc;

/* Starts a copy; *handle identifies it until ge_release. host_mode: GE_HOST_* (| GE_COPY_DIRECT_ONLY).
 * stream: a CUstream (0: none) the copy is ordered on: it starts after work already queued there, and
 * later work there waits for it. */
int ge_copy(ge_engine *e, const ge_copy_desc *d, int host_mode, uint64_t stream, uint64_t *handle);
/* GE_OK when done, GE_ETIMEOUT while running (timeout_s < 0: wait forever), else the copy's error. */
int ge_wait(ge_engine *e, uint64_t handle, double timeout_s);
int ge_copy_chunks(ge_engine *e, uint64_t handle, uint64_t *chunks, int *paths_used);
/* ge_wait, then (unless GE_ETIMEOUT) ge_copy_chunks and ge_release: one call to finish a copy. */
int ge_finish(ge_engine *e, uint64_t handle, double timeout_s, uint64_t *chunks, int *paths_used);
/* A synchronous ge_copy + ge_finish: returns once the copy has landed (or failed), with no handle;
 * out[0] = chunks, out[1] = paths used. A copy that takes the single direct path while that path is
 * idle is one driver copy and one stream sync on the calling thread (on `stream` when given), with no
 * dispatcher, worker or event; others are started and waited for. */
int ge_copy_sync(ge_engine *e, const ge_copy_desc *d, int host_mode, uint64_t stream, uint64_t out[2]);
int ge_release(ge_engine *e, uint64_t handle);

#ifdef __cplusplus
}
#endif
#endif
