/* Internals shared by the files of libgpudash_preload.so (plain C, so that a process that never copies
 * loads no C++ runtime). The engine itself (libgpudash_engine.so) is opened with RTLD_LOCAL on the first
 * copy worth taking and is reached only through its C ABI (gpudash_engine.h).
 *
 * The files use one another's functions in one direction only (tests/preload/test_preload_units.py):
 * state.c <- real.c, shm.c <- lifecycle.c <- carry.c <- doors.c (each may use those left of it).
 *
 * Environment, read once at start:
 *   GPUDASH_PRELOAD=off           everything passes through (one line on stderr at the first copy call)
 *   GPUDASH_PRELOAD_KNOBS         start-up knobs, "name=integer,..." with gpudash/engine/config.py's knob names
 *                                 (h2d/d2h_chunk_bytes, h2d/d2h_fallback_bytes, outstanding, direct_first,
 *                                 staging_threads, h2d/d2h_staging_bytes); unset ones keep their defaults
 *   GPUDASH_PRELOAD_NAME          the name the stats block carries (the server's name)
 *   GPUDASH_PRELOAD_PINNED=always take pinned copies above the fallback threshold even on a single path
 *   GPUDASH_PRELOAD_PUBLISH_MS    stats publishing period (100)
 *   GPUDASH_PRELOAD_TRACE=1       one line on stderr for each copy worth a decision (at least the smallest
 *                                 size any policy takes): the call, both sides' memory (with the host
 *                                 side's mapping from /proc/self/maps) and the decision with its reason
 *   GPUDASH_ENGINE_LIB            the engine library (default: libgpudash_engine.so beside this one) */
#ifndef GPUDASH_PRELOAD_H
#define GPUDASH_PRELOAD_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpudash_preload_shm.h"

#define GP_API __attribute__((visibility("default")))
#define GP_LIKELY(x) __builtin_expect(!!(x), 1)
#define GP_UNLIKELY(x) __builtin_expect(!!(x), 0)

typedef int CUresult;
typedef void *CUstream;
typedef void *CUcontext;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
enum { GP_CU_NOT_READY = 600, GP_CU_NOT_SUPPORTED = 801 };
/* cudaMemcpyKind */
enum { GP_KIND_H2H = 0, GP_KIND_H2D = 1, GP_KIND_D2H = 2, GP_KIND_D2D = 3, GP_KIND_DEFAULT = 4 };

/* The intercepted functions; each has a slot for the original it forwards to. */
enum {
  GP_FN_CUDA_MEMCPY, GP_FN_CUDA_MEMCPY_PTDS, GP_FN_CUDA_MEMCPY_ASYNC, GP_FN_CUDA_MEMCPY_ASYNC_PTSZ,
  GP_FN_CU_HTOD, GP_FN_CU_HTOD_PTDS, GP_FN_CU_DTOH, GP_FN_CU_DTOH_PTDS,
  GP_FN_CU_HTOD_ASYNC, GP_FN_CU_HTOD_ASYNC_PTSZ, GP_FN_CU_DTOH_ASYNC, GP_FN_CU_DTOH_ASYNC_PTSZ,
  GP_FN_CU_MEMCPY, GP_FN_CU_MEMCPY_PTDS, GP_FN_CU_MEMCPY_ASYNC, GP_FN_CU_MEMCPY_ASYNC_PTSZ,
  GP_FN_CU_GPA, GP_FN_CU_GPA_V2,
  GP_NFN
};

typedef struct {
  const char *name;      /* exported name in libcudart.so.13 / libcuda.so.1 */
  const char *base;      /* cuGetProcAddress base name (driver only) */
  int driver;            /* 1: libcuda, 0: libcudart */
  int per_thread;        /* default stream is the per-thread one (_ptds/_ptsz) */
  int async;
  int min_version;       /* cuGetProcAddress cudaVersion from which this variant is returned */
} gp_fn_info;

/* One intercepted call, as the caller made it: enough to take it or hand it to the original. */
typedef struct {
  int fn;
  void *dst;
  const void *src;
  size_t n;
  int kind;          /* GP_KIND_*: given by cudart callers, implied by the driver function */
  CUstream stream;   /* as given (0: the function's default stream) */
} gp_call;

/* The engine's C ABI, opened from libgpudash_engine.so. */
typedef struct {
  int (*abi_version)(void);
  const char *(*strerror)(int);
  int (*create_cuda)(const ge_knobs *, ge_engine **);
  int (*num_gpus)(ge_engine *);
  int (*set_knobs)(ge_engine *, const ge_knobs *);
  int (*get_knobs)(ge_engine *, ge_knobs *);
  int (*num_paths)(ge_engine *);
  int (*stats)(ge_engine *, ge_path_stats *, int, ge_link_stats *, int);
  int (*classify)(ge_engine *, uint64_t, int *, int *, uint64_t *);
  int (*copy)(ge_engine *, const ge_copy_desc *, int, uint64_t, uint64_t *);
  int (*wait)(ge_engine *, uint64_t, double);
  int (*release)(ge_engine *, uint64_t);
  int (*copy_sync)(ge_engine *, const ge_copy_desc *, int, uint64_t, uint64_t[2]);
} gp_engine_api;

/* The driver functions the preload itself calls (the real ones, from libcuda's cuGetProcAddress). */
typedef struct {
  CUresult (*cuStreamIsCapturing)(CUstream, int *);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
  CUresult (*cuEventCreate)(CUevent *, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, uint32_t, unsigned);
  CUresult (*cuLaunchHostFunc)(CUstream, void (*)(void *), void *);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext *);
  CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
  CUresult (*cuStreamCreate)(CUstream *, unsigned);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
} gp_driver_api;

/* Policy values the hot path reads (relaxed atomics; a copy uses either the old or the new value). */
typedef struct {
  _Atomic int state;            /* GP_STATE_* */
  _Atomic int enabled;          /* the knob block's live switch */
  _Atomic int setup;            /* 0: first door entry pending, 1: doing it, 2: done */
  _Atomic int engine_state;     /* 0: not started, 1: starting, 2: running, 3: failed */
  _Atomic uint64_t engine_start_ns;  /* how long the engine took to start (0 until it has) */
  _Atomic uint64_t quick_min[2];   /* copies below this many bytes pass at once */
  _Atomic uint64_t staging_bytes[2];
  _Atomic uint64_t fallback_bytes[2];
  _Atomic int pinned_always;    /* GPUDASH_PRELOAD_PINNED=always: take pinned copies on one path too */
  _Atomic int pinned_takes[2];  /* some pinned copy of this direction may be taken (multipath or always) */
  int multipath[GPUDASH_PRELOAD_MAX_GPUS][2];         /* set once the engine runs: (gpu, dir) has more than the direct path */
  ge_engine *eng;
  gp_engine_api ge;
  gp_driver_api cu;
  pid_t pid;                    /* the process that owns the shared-memory blocks */
  char name[GPUDASH_PRELOAD_NAME_LEN];  /* $GPUDASH_PRELOAD_NAME, read once at start */
} gp_global;

/* Counters per direction, private to the process; the publisher copies them into the stats block. */
enum { GP_C_TAKEN, GP_C_PASSED, GP_C_BYTES_TAKEN, GP_C_BYTES_PASSED, GP_C_NS_CALLS, GP_C_NS_LANDED, GP_C_STAGED,
       GP_C_ERRORS, GP_C_WHY, GP_C_CPU_CALLS = GP_C_WHY + GP_WHY_N, GP_C_N };
typedef struct {
  _Atomic uint64_t v[GP_C_N];  /* in the order of gp_direction_stats' fields */
} gp_counters;
_Static_assert(sizeof(gp_counters) == sizeof(gp_direction_stats), "gp_counters mirrors gp_direction_stats");

/* state.c: the process state, which every other file reads and which depends on none of them */
extern gp_global gp;
extern gp_counters gp_count[2];

static inline void gp_add(int dir, int which, uint64_t v) {
  if (dir == GE_H2D || dir == GE_D2H) atomic_fetch_add_explicit(&gp_count[dir].v[which], v, memory_order_relaxed);
}

/* Depth of calls into an original function on this thread: the driver doors pass such nested calls
 * (cudart calling the driver) straight through, uncounted. */
extern __thread int gp_nested __attribute__((tls_model("initial-exec")));

uint64_t gp_now_ns(void);
void gp_say(const char *fmt, ...);  /* one line on stderr, prefixed "gpudash preload: " */

/* real.c */
extern const gp_fn_info gp_fns[GP_NFN];
extern _Atomic(void *) gp_real[GP_NFN];  /* each intercepted function's original, once known */
typedef void *(*gp_dlsym_t)(void *, const char *);
gp_dlsym_t gp_dlsym_fn(void);       /* glibc's dlsym */
void *gp_real_dlsym(void *handle, const char *name);
void *gp_original(int fn);          /* the original of an intercepted function (resolved on first use) */
int gp_call_original(const gp_call *c);
int gp_own_address(const void *addr);
void gp_own_add(const void *addr_in_object);
int gp_load_driver(void);           /* fills gp.cu; 0 on success */

/* lifecycle.c */
void gp_first_entry(int worth_taking);  /* worth_taking: this copy may be taken */
int gp_engine_ready(void);          /* starts the engine on first use; 1 when it runs */

/* shm.c */
int gp_startup_knobs(ge_knobs *k, uint64_t staging[2], char *err, size_t errlen);
/* `running`: the engine has started and its paths are known (before that, pinned copies may be taken). */
void gp_apply_policy(const ge_knobs *k, const uint64_t staging[2], int running);
int gp_shm_create(void);
void gp_shm_publish(void);
void gp_shm_poll_knobs(void);
void gp_shm_close(void);

/* carry.c: 1 when the copy was taken (*rc is the caller's result), 0 to pass it through (*dir set when
 * the direction became known, *why to the reason, a GP_WHY_* of gpudash_preload_shm.h). */
int gp_take(const gp_call *c, int *rc, int *dir, int *why);
/* GPUDASH_PRELOAD_TRACE: one line for this decision (why: GP_WHY_TAKEN or the reason it passed). */
void gp_trace(const gp_call *c, int why);
extern int gp_tracing;

#endif
