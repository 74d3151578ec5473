/* Carrying a copy the doors took. The rule above all: never corrupt bytes, never hang. Anything that
 * fails before the copy is committed passes the call to the original; a copy the engine fails is
 * redone by the original (synchronous copies) or by the driver on a private stream (async copies).
 *
 * - Pageable host memory (cudaMemcpyAsync on it is synchronous for the host), and every synchronous
 *   copy: wait for the work already in the stream, copy through the engine, return once landed.
 * - Pinned async copies: the caller's stream gets an event (the work ahead) and then a placeholder, a
 *   wait on a flag in host-mapped memory (or, without stream memory ops, a host function that blocks);
 *   the mover thread starts the engine once the event has fired and raises the flag once the bytes
 *   have landed. The call returns at once. */
#include "preload.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* ---- per-context resources: spare events and a private stream for redone copies -------------- */
#define GP_MAX_CTX 32
#define GP_EVENTS 64
typedef struct {
  CUcontext ctx;
  CUevent ev[GP_EVENTS];
  int nev;
  CUstream side;
} ctx_res;
static ctx_res res[GP_MAX_CTX];
static int nres;
static pthread_mutex_t res_m = PTHREAD_MUTEX_INITIALIZER;

static ctx_res *res_of(CUcontext ctx) {  /* under res_m */
  for (int i = 0; i < nres; ++i)
    if (res[i].ctx == ctx) return &res[i];
  if (nres == GP_MAX_CTX) return NULL;
  res[nres].ctx = ctx;
  return &res[nres++];
}

static CUevent event_get(CUcontext ctx) {
  CUevent e = NULL;
  pthread_mutex_lock(&res_m);
  ctx_res *r = res_of(ctx);
  if (r && r->nev) e = r->ev[--r->nev];
  pthread_mutex_unlock(&res_m);
  if (e || !r) return e;
  if (gp.cu.cuCtxPushCurrent(ctx)) return NULL;
  if (gp.cu.cuEventCreate(&e, 0x2 /* DISABLE_TIMING */)) e = NULL;
  CUcontext x;
  gp.cu.cuCtxPopCurrent(&x);
  return e;
}

static void event_put(CUcontext ctx, CUevent e) {
  pthread_mutex_lock(&res_m);
  ctx_res *r = res_of(ctx);
  if (r && r->nev < GP_EVENTS) {
    r->ev[r->nev++] = e;
    e = NULL;
  }
  pthread_mutex_unlock(&res_m);
  if (e) gp.cu.cuEventDestroy(e);
}

/* Waits until the work queued in `s` so far has finished (the event is recorded in s's context). */
static int wait_prior(CUstream s, CUcontext ctx) {
  CUevent e = event_get(ctx);
  if (!e) return -1;
  int rc = gp.cu.cuEventRecord(e, s);
  if (!rc) rc = gp.cu.cuEventSynchronize(e);
  event_put(ctx, e);
  return rc;
}

/* ---- the gate: flags in host-mapped memory ------------------------------------------------ */
#define GP_SLOTS 4096u
static uint32_t *flags;
static CUdeviceptr flags_dev;
static _Atomic unsigned char slot_busy[GP_SLOTS];
static _Atomic uint32_t next_seq;
static _Atomic int memops = 1;  /* 0 once the driver refused cuStreamWaitValue32 */

static int flags_ready(CUcontext ctx) {
  pthread_mutex_lock(&res_m);
  if (!flags && gp.cu.cuCtxPushCurrent(ctx) == 0) {
    void *p = NULL;
    CUdeviceptr dev = 0;
    if (gp.cu.cuMemHostAlloc(&p, GP_SLOTS * 4, 0x1 | 0x2 /* PORTABLE | DEVICEMAP */) == 0 &&
        gp.cu.cuMemHostGetDevicePointer(&dev, p, 0) == 0) {
      memset(p, 0, GP_SLOTS * 4);
      flags_dev = dev;
      __atomic_store_n(&flags, (uint32_t *)p, __ATOMIC_RELEASE);
    }
    CUcontext x;
    gp.cu.cuCtxPopCurrent(&x);
  }
  pthread_mutex_unlock(&res_m);
  return flags != NULL;
}

typedef struct job {
  struct job *next;
  ge_copy_desc d;
  CUcontext ctx;
  CUevent ev;           /* flag gate: recorded before the placeholder */
  uint32_t slot, value;
  int hostfunc;         /* host-function gate */
  _Atomic int started;  /* host-function gate: the stream reached it */
  int done;             /* host-function gate: released (under gate_m) */
  int running;
  uint64_t handle;
  uint64_t t0;
} job;

static pthread_mutex_t mv_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mv_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t gate_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static job *pending;
static pthread_once_t mover_once = PTHREAD_ONCE_INIT;
static int mover_ok;

/* Runs on the driver's callback thread when the stream reaches the gate; holds the stream until the
 * copy has landed. It calls no CUDA function. */
static void gate_fn(void *arg) {
  job *j = arg;
  atomic_store(&j->started, 1);
  pthread_mutex_lock(&mv_m);
  pthread_cond_signal(&mv_cv);
  pthread_mutex_unlock(&mv_m);
  pthread_mutex_lock(&gate_m);
  while (!j->done) pthread_cond_wait(&gate_cv, &gate_m);
  pthread_mutex_unlock(&gate_m);
  free(j);
}

/* A copy the engine could not carry, done by the driver on a private stream (the caller's stream is
 * held by the gate, so the original function would wait for itself). */
static void redo(job *j) {
  int rc = gp.cu.cuCtxPushCurrent(j->ctx);
  if (!rc) {
    pthread_mutex_lock(&res_m);
    ctx_res *r = res_of(j->ctx);
    if (r && !r->side && gp.cu.cuStreamCreate(&r->side, 0x1 /* NON_BLOCKING */)) r->side = NULL;
    CUstream side = r ? r->side : NULL;
    pthread_mutex_unlock(&res_m);
    /* unified addressing: one call for both directions, not the functions the engine failed in */
    rc = side ? gp.cu.cuMemcpyAsync(j->d.dst, j->d.src, j->d.nbytes, side) : 1;
    if (!rc) rc = gp.cu.cuStreamSynchronize(side);
    CUcontext x;
    gp.cu.cuCtxPopCurrent(&x);
  }
  if (rc) gp_add(j->d.direction, GP_C_ERRORS, 1);
}

static void release_gate(job *j) {
  gp_add(j->d.direction, GP_C_NS_LANDED, gp_now_ns() - j->t0);
  if (j->hostfunc) {
    pthread_mutex_lock(&gate_m);
    j->done = 1;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_m);
    return;  /* gate_fn frees it */
  }
  __atomic_store_n(&flags[j->slot], j->value, __ATOMIC_SEQ_CST);
  event_put(j->ctx, j->ev);
  atomic_store(&slot_busy[j->slot], 0);
  free(j);
}

/* One step of a job; 1 when it is finished (gate released). */
static int step(job *j, int *progress) {
  if (!j->running) {
    if (j->hostfunc ? !atomic_load(&j->started) : gp.cu.cuEventQuery(j->ev) == GP_CU_NOT_READY) return 0;
    *progress = 1;
    if (gp.ge.copy(gp.eng, &j->d, GE_HOST_DIRECT, 0, &j->handle) != GE_OK) {
      redo(j);
      return 1;
    }
    j->running = 1;
  }
  int rc = gp.ge.wait(gp.eng, j->handle, 0.0);
  if (rc == GE_ETIMEOUT) return 0;
  *progress = 1;
  gp.ge.release(gp.eng, j->handle);
  if (rc) redo(j);
  return 1;
}

static void *mover(void *arg) {
  (void)arg;
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  /* its naps are microseconds: 1 us slack, not 50 */
  job *active = NULL;
  long nap_ns = 0;
  for (;;) {
    pthread_mutex_lock(&mv_m);
    if (!active && !pending) {
      pthread_cond_wait(&mv_cv, &mv_m);
    } else if (nap_ns && !pending) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += nap_ns;
      if (until.tv_nsec >= 1000000000L) until.tv_sec += 1, until.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&mv_cv, &mv_m, &until);
    }
    while (pending) {
      job *j = pending, **tail = &active;
      pending = j->next;
      while (*tail) tail = &(*tail)->next;
      j->next = NULL;
      *tail = j;
    }
    pthread_mutex_unlock(&mv_m);
    int progress = 0;
    for (job **pp = &active; *pp;) {
      job *j = *pp;
      if (step(j, &progress)) {
        *pp = j->next;
        release_gate(j);
      } else {
        pp = &j->next;
      }
    }
    /* nothing moved: nap, 2 us doubling up to 20 us (a new job or a reached gate wakes it early); a
     * landed copy is noticed within 20 us, small beside the copies that are gated (megabytes) */
    nap_ns = progress ? 0 : nap_ns ? (nap_ns * 2 > 20000 ? 20000 : nap_ns * 2) : 2000;
  }
  return NULL;
}

static void start_mover(void) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  if (pthread_create(&t, NULL, mover, NULL) == 0) {
    pthread_setname_np(t, "gpudash-mover");
    pthread_detach(t);
    mover_ok = 1;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* 1: the gate is in the stream and the mover has the job; 0: nothing was queued, pass the call. */
static int carry_async(const ge_copy_desc *d, CUstream s, CUcontext ctx, uint64_t t0) {
  pthread_once(&mover_once, start_mover);
  if (!mover_ok) return 0;
  job *j = calloc(1, sizeof *j);
  if (!j) return 0;
  j->d = *d;
  j->ctx = ctx;
  j->t0 = t0;
  int queued = 0;
  if (atomic_load(&memops) && flags_ready(ctx)) {
    uint32_t seq = atomic_fetch_add(&next_seq, 1) + 1;
    j->slot = seq % GP_SLOTS;
    j->value = seq;
    unsigned char idle = 0;
    if (atomic_compare_exchange_strong(&slot_busy[j->slot], &idle, 1)) {
      /* nobody waits on an idle slot: lower it to just below the value this gate waits for */
      __atomic_store_n(&flags[j->slot], seq - 1, __ATOMIC_SEQ_CST);
      j->ev = event_get(ctx);
      if (j->ev && gp.cu.cuEventRecord(j->ev, s) == 0) {
        int rc = gp.cu.cuStreamWaitValue32(s, flags_dev + 4ull * j->slot, seq, 0x0 /* GEQ */);
        if (rc == 0) queued = 1;
        else if (rc == GP_CU_NOT_SUPPORTED) atomic_store(&memops, 0);
      }
      if (!queued) {
        if (j->ev) event_put(ctx, j->ev);
        j->ev = NULL;
        atomic_store(&slot_busy[j->slot], 0);
      }
    }
  }
  if (!queued) {  /* no stream memory ops (or they failed for this stream): a host function holds it */
    j->hostfunc = 1;
    queued = gp.cu.cuLaunchHostFunc(s, gate_fn, j) == 0;
  }
  if (!queued) {
    free(j);
    return 0;
  }
  pthread_mutex_lock(&mv_m);
  j->next = pending;
  pending = j;
  pthread_cond_signal(&mv_cv);
  pthread_mutex_unlock(&mv_m);
  return 1;
}

/* The calling thread's CPU clock: read around the copies that are taken (megabytes each), never on the
 * way of one that passes. */
static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the decision ----------------------------------------------------------------------- */
#define PASS(reason) return (*why = (reason)), 0

int gp_take(const gp_call *c, int *rc, int *dir, int *why) {
  if (!gp_engine_ready()) PASS(GP_WHY_ENGINE);
  uint64_t t0 = gp_now_ns();
  const gp_fn_info *f = &gp_fns[c->fn];
  uint64_t dst = (uint64_t)(uintptr_t)c->dst, src = (uint64_t)(uintptr_t)c->src, n = c->n;
  /* The host side first (the source unless the kind says D2H): pinned memory where no copy of that
   * direction can go multipath passes after this one classification. */
  int src_first = c->kind != GP_KIND_D2H;
  int k[2], g[2];
  uint64_t a[2];
  if (gp.ge.classify(gp.eng, src_first ? src : dst, &k[0], &g[0], &a[0])) PASS(GP_WHY_FAILED);
  if (k[0] == GE_MEM_PINNED && !atomic_load_explicit(&gp.pinned_takes[src_first ? GE_H2D : GE_D2H], memory_order_relaxed))
    PASS(GP_WHY_PINNED);
  if (gp.ge.classify(gp.eng, src_first ? dst : src, &k[1], &g[1], &a[1])) PASS(GP_WHY_FAILED);
  int ksrc = k[!src_first], gsrc = g[!src_first], kdst = k[src_first], gdst = g[src_first];
  uint64_t asrc = a[!src_first], adst = a[src_first];
  int d;
  if (kdst == GE_MEM_DEVICE && ksrc != GE_MEM_DEVICE) d = GE_H2D;
  else if (ksrc == GE_MEM_DEVICE && kdst != GE_MEM_DEVICE) d = GE_D2H;
  else PASS(GP_WHY_NOT_HOST_DEVICE);
  if ((c->kind == GP_KIND_H2D && d != GE_H2D) || (c->kind == GP_KIND_D2H && d != GE_D2H)) PASS(GP_WHY_NOT_HOST_DEVICE);
  *dir = d;
  int gpu = d == GE_H2D ? gdst : gsrc;
  uint64_t dev_avail = d == GE_H2D ? adst : asrc, host_avail = d == GE_H2D ? asrc : adst;
  int host_kind = d == GE_H2D ? ksrc : kdst;
  if (gpu < 0 || gpu >= GPUDASH_PRELOAD_MAX_GPUS) PASS(GP_WHY_FAILED);
  if (dev_avail < n) PASS(GP_WHY_RANGE);
  CUstream s = c->stream ? c->stream : f->per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
  int capturing = 0;
  if (gp.cu.cuStreamIsCapturing(s, &capturing) != 0) PASS(GP_WHY_FAILED);
  if (capturing != 0) PASS(GP_WHY_CAPTURE);
  int staged = host_kind == GE_MEM_PAGEABLE;
  if (staged) {
    if (n < atomic_load_explicit(&gp.staging_bytes[d], memory_order_relaxed)) PASS(GP_WHY_SMALL);
  } else {
    if (host_avail && host_avail < n) PASS(GP_WHY_RANGE);
    if (n < atomic_load_explicit(&gp.fallback_bytes[d], memory_order_relaxed)) PASS(GP_WHY_SMALL);
    if (!gp.multipath[gpu][d] && !atomic_load_explicit(&gp.pinned_always, memory_order_relaxed)) PASS(GP_WHY_PINNED);
  }
  CUcontext ctx = NULL;
  if (gp.cu.cuStreamGetCtx(s, &ctx) != 0 || !ctx) PASS(GP_WHY_FAILED);
  uint64_t cpu0 = thread_cpu_ns();
  ge_copy_desc desc = {d, gpu, dst, src, n};
  if (!staged && f->async) {
    if (!carry_async(&desc, s, ctx, t0)) PASS(GP_WHY_FAILED);
  } else {
    if (wait_prior(s, ctx) != 0) PASS(GP_WHY_FAILED);  /* the stream failed: the original reports it */
    uint64_t out[2];
    if (gp.ge.copy_sync(gp.eng, &desc, staged ? GE_HOST_STAGED : GE_HOST_DIRECT, 0, out) != GE_OK) PASS(GP_WHY_FAILED);
    gp_add(d, GP_C_NS_LANDED, gp_now_ns() - t0);
  }
  gp_add(d, GP_C_TAKEN, 1);
  gp_add(d, GP_C_BYTES_TAKEN, n);
  if (staged) gp_add(d, GP_C_STAGED, 1);
  gp_add(d, GP_C_NS_CALLS, gp_now_ns() - t0);
  gp_add(d, GP_C_CPU_CALLS, thread_cpu_ns() - cpu0);
  *rc = 0;
  *why = GP_WHY_TAKEN;
  return 1;
}

/* ---- GPUDASH_PRELOAD_TRACE ------------------------------------------------------------------ */
int gp_tracing;

__attribute__((constructor)) static void trace_from_env(void) {
  const char *t = getenv("GPUDASH_PRELOAD_TRACE");
  gp_tracing = t && *t && strcmp(t, "0") != 0;
}

static const char *const why_names[GP_WHY_N] = {
    [GP_WHY_TAKEN] = "taken", [GP_WHY_ENGINE] = "passed: engine not running",
    [GP_WHY_PINNED] = "passed: pinned, direct path only", [GP_WHY_SMALL] = "passed: below threshold",
    [GP_WHY_NOT_HOST_DEVICE] = "passed: not host<->device", [GP_WHY_CAPTURE] = "passed: stream capture",
    [GP_WHY_RANGE] = "passed: past the allocation", [GP_WHY_FAILED] = "passed: a call failed",
};

/* The /proc/self/maps line of the mapping holding addr (permissions, offset, file), or "?". */
static void mapping_of(uint64_t addr, char *out, size_t len) {
  snprintf(out, len, "?");
  FILE *m = fopen("/proc/self/maps", "re");
  if (!m) return;
  char line[512];
  while (fgets(line, sizeof line, m)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && addr >= lo && addr < hi) {
      line[strcspn(line, "\n")] = 0;
      snprintf(out, len, "%s", line);
      break;
    }
  }
  fclose(m);
}

static const char *mem_name(uint64_t p) {
  int k = -1, g = -1;
  uint64_t a = 0;
  if (atomic_load(&gp.engine_state) != 2 || gp.ge.classify(gp.eng, p, &k, &g, &a)) return "unknown";
  return k == GE_MEM_DEVICE ? "device" : k == GE_MEM_PINNED ? "pinned" : "pageable";
}

void gp_trace(const gp_call *c, int why) {
  uint64_t host = (uint64_t)(uintptr_t)(c->kind == GP_KIND_D2H ? c->dst : c->src);
  char map[512];
  mapping_of(host, map, sizeof map);
  gp_say("trace %s kind %d %zu B src %s dst %s host map [%s]: %s", gp_fns[c->fn].name, c->kind, c->n,
         mem_name((uint64_t)(uintptr_t)c->src), mem_name((uint64_t)(uintptr_t)c->dst), map,
         why >= 0 && why < GP_WHY_N ? why_names[why] : "passed: preload inactive");
}
