/* The two shared-memory blocks between a preloaded process (libgpudash_preload.so) and gpudash.
 *
 * The preloaded process creates both with shm_open (O_EXCL, mode 0600) when it first enters a copy door
 * (so processes that never copy, like a shell under `gpudash run`, leave none), and unlinks them at exit
 * (unless GPUDASH_PRELOAD_KEEP_FOR names its parent, `gpudash run --stats`, which reads and removes them):
 *   GPUDASH_PRELOAD_STATS_FMT  "/gpudash-preload-stats-<pid>"  written by the process, read by gpudash
 *   GPUDASH_PRELOAD_KNOBS_FMT  "/gpudash-preload-knobs-<pid>"  written by gpudash, read by the process
 * Nothing else crosses the process boundary: if gpudash dies, the server keeps working with the knobs
 * it last read. gpudash/preload/shm.py mirrors these structs with ctypes; a test keeps the two equal.
 *
 * Both blocks use a sequence lock: the writer makes `seq` odd, writes, then makes it even again (with
 * release ordering); a reader copies the block and retries while `seq` was odd or changed meanwhile.
 * /dev/shm is every local user's, so the library never maps a block (one truncated under a mapping would
 * give its host program SIGBUS): it writes and reads with pwrite/pread, as gpudash does.
 */
#ifndef GPUDASH_PRELOAD_SHM_H
#define GPUDASH_PRELOAD_SHM_H

#include <stdint.h>

#include "../gpudash_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPUDASH_PRELOAD_STATS_FMT "/gpudash-preload-stats-%d"
#define GPUDASH_PRELOAD_KNOBS_FMT "/gpudash-preload-knobs-%d"
#define GPUDASH_PRELOAD_MAGIC 0x4C504447u /* "GDPL" */
#define GPUDASH_PRELOAD_SHM_VERSION 3
#define GPUDASH_PRELOAD_MAX_PATHS 64
#define GPUDASH_PRELOAD_MAX_GPUS 16
#define GPUDASH_PRELOAD_NAME_LEN 64

/* What the interposer is doing in this process. */
enum {
  GP_STATE_ACTIVE = 0,      /* copies that fit the policy go through the engine */
  GP_STATE_OFF = 1,         /* GPUDASH_PRELOAD=off, or the knob block's enabled = 0: everything passes */
  GP_STATE_FAILED = 2,      /* the engine could not start: everything passes through */
  GP_STATE_PASSTHROUGH = 3  /* after fork() in the child, or once exit() began */
};

/* Why a copy worth a decision (at least the smallest size any policy takes) was passed to the original
 * function: gp_direction_stats.passed_why[] counts each. Copies below that size, and every copy while
 * the preload is off or failed, pass without a decision and are counted in copies_passed alone. */
enum {
  GP_WHY_TAKEN = 0,        /* not a reason: the copy was taken (slot 0 stays 0) */
  GP_WHY_ENGINE = 1,       /* the engine is not running (starting too long, or it failed) */
  GP_WHY_PINNED = 2,       /* pinned host memory and only the direct path: the driver's copy is as fast */
  GP_WHY_SMALL = 3,        /* below the staging (pageable) or fallback (pinned) threshold */
  GP_WHY_NOT_HOST_DEVICE = 4,  /* both sides on the host or both on a device, or the kind disagrees */
  GP_WHY_CAPTURE = 5,      /* the stream is being captured into a CUDA graph */
  GP_WHY_RANGE = 6,        /* the copy runs past the end of the device (or pinned) allocation */
  GP_WHY_FAILED = 7,       /* a driver or engine call failed before the copy began: the original does it */
  GP_WHY_N = 8
};

/* Counters per direction (index GE_H2D / GE_D2H). "taken" = carried by the engine; "passed" = handed to
 * the original function. Time is wall time inside the intercepted calls, in nanoseconds. */
typedef struct {
  uint64_t copies_taken;
  uint64_t copies_passed;
  uint64_t bytes_taken;
  uint64_t bytes_passed;
  uint64_t ns_in_calls_taken;   /* from entry to return of the intercepted call */
  uint64_t ns_to_landed_taken;  /* from entry until the bytes were in place (async copies too) */
  uint64_t staged_copies;       /* of copies_taken: pageable memory through the staging ring */
  uint64_t errors;              /* copies that returned a CUDA error to the caller */
  uint64_t passed_why[GP_WHY_N];  /* of copies_passed: those worth a decision, by reason (GP_WHY_*) */
  uint64_t cpu_ns_calls_taken;  /* CPU time of the calling threads inside the taken calls (their waits too) */
} gp_direction_stats;

typedef struct {
  uint32_t magic;               /* GPUDASH_PRELOAD_MAGIC */
  uint32_t version;             /* GPUDASH_PRELOAD_SHM_VERSION */
  uint64_t seq;                 /* sequence lock, odd while the process writes */
  int32_t pid;
  int32_t state;                /* GP_STATE_* */
  int32_t num_paths;            /* valid entries of paths[] */
  int32_t num_gpus;
  double started_at;            /* CLOCK_REALTIME seconds when the interposer started */
  double updated_at;            /* CLOCK_REALTIME seconds of the last publish (about every 100 ms) */
  char name[GPUDASH_PRELOAD_NAME_LEN];  /* $GPUDASH_PRELOAD_NAME (the server's name), NUL-terminated */
  gp_direction_stats dir[2];
  uint64_t knobs_generation;    /* the generation of the knob block last applied (0: none yet) */
  ge_knobs knobs;               /* the knobs in force */
  uint64_t h2d_staging_bytes;   /* pageable copies below these pass through (the driver stages them) */
  uint64_t d2h_staging_bytes;
  uint64_t engine_start_ns;     /* how long the engine took to start, started at the first copy (0: not yet) */
  uint64_t threads_cpu_ns;      /* CPU time of every thread the engine and the interposer started (staging,
                                   dispatchers, path workers, mover, stats), idle spinning included; read
                                   at every publish (a thread started since is counted within a second) */
  ge_path_stats paths[GPUDASH_PRELOAD_MAX_PATHS];
  ge_link_stats links[GPUDASH_PRELOAD_MAX_GPUS];      /* per GPU, index = GPU ordinal; num_gpus entries valid */
} gp_stats_block;

/* gpudash bumps `generation` (inside the sequence lock) when it writes new knobs; the process polls it
 * and applies a changed block with ge_set_knobs; a block it refuses leaves the old knobs in force and
 * sets `rejected_generation` in its stats' counterpart below. */
typedef struct {
  uint32_t magic;
  uint32_t version;
  uint64_t seq;
  uint64_t generation;          /* 0: gpudash has written nothing; the process's start-up knobs hold */
  ge_knobs knobs;
  uint64_t h2d_staging_bytes;
  uint64_t d2h_staging_bytes;
  int32_t enabled;              /* 0: pass every copy through from now on (a live kill switch) */
  int32_t reserved;
  uint64_t rejected_generation; /* written by the process: the last generation ge_set_knobs refused */
} gp_knobs_block;

#ifdef __cplusplus
}
#endif

#endif
