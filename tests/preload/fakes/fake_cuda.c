/* A fake libcuda.so.1 for the preload's CI tests: the driver functions the engine's CUDA backend, the
 * preload and the fake cudart call, with the real names. Device memory is host memory the fake
 * allocated; a stream is a worker thread running its queued operations in order (copies are memcpy,
 * events mark progress, cuStreamWaitValue32 blocks the worker on a host flag, host functions run on the
 * worker). Test hooks: fakecuda_launch (a kernel-like operation), fakecuda_calls (how often a copy
 * function was called) and fakecuda_inject (copy functions fail from now on). FAKECUDA_GPUS sets the
 * number of GPUs (2), FAKECUDA_NO_MEMOPS refuses cuStreamWaitValue32, FAKECUDA_NULL_COPIES makes copies
 * no-ops. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, EINVAL = 1, ENOTINIT = 3, EINVALCTX = 201, EHANDLE = 400, ENOTREADY = 600, ENOTSUP = 801 };

/* ---- contexts -------------------------------------------------------------------------------- */
typedef struct { int dev; } ctx_t;
static int ngpus = 2;
static ctx_t ctxs[8];
static __thread ctx_t *ctx_stack[16];
static __thread int ctx_depth;
static ctx_t *cur(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

/* ---- one lock and one condition for all progress (streams, events) -------------------------- */
static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t C = PTHREAD_COND_INITIALIZER;
static int forked;  /* in a fork() child there are no workers: operations run inline */

typedef struct { uint64_t recorded, completed; } event_t;
enum { OP_COPY, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_HOSTFN };
typedef struct op {
  struct op *next;
  int type;
  void *dst;
  const void *src;
  size_t n;
  event_t *ev;
  uint64_t target;
  volatile uint32_t *flag;
  uint32_t value;
  void (*fn)(void *);
  void *arg;
} op_t;
typedef struct stream {
  ctx_t *ctx;
  op_t *head, *tail;
  uint64_t enq, done;
  int capturing, stop;
  pthread_t th;
} stream_t;

static void run_op(op_t *o) {
  switch (o->type) {
    case OP_COPY: memmove(o->dst, o->src, o->n); break;
    case OP_RECORD:
      pthread_mutex_lock(&G);
      if (o->ev->completed < o->target) o->ev->completed = o->target;
      pthread_cond_broadcast(&C);
      pthread_mutex_unlock(&G);
      break;
    case OP_WAIT_EVENT:
      pthread_mutex_lock(&G);
      while (o->ev->completed < o->target) pthread_cond_wait(&C, &G);
      pthread_mutex_unlock(&G);
      break;
    case OP_WAIT_VALUE:
      while ((int32_t)(__atomic_load_n(o->flag, __ATOMIC_ACQUIRE) - o->value) < 0) {
        struct timespec ts = {0, 2000};
        nanosleep(&ts, NULL);
      }
      break;
    case OP_HOSTFN: o->fn(o->arg); break;
  }
}

static void *worker(void *arg) {
  stream_t *s = arg;
  pthread_mutex_lock(&G);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&C, &G);
    if (!s->head) break;
    op_t *o = s->head;
    pthread_mutex_unlock(&G);
    run_op(o);
    pthread_mutex_lock(&G);
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    s->done++;
    free(o);
    pthread_cond_broadcast(&C);
  }
  pthread_mutex_unlock(&G);
  return NULL;
}

static stream_t *stream_new(ctx_t *c) {
  stream_t *s = calloc(1, sizeof *s);
  s->ctx = c;
  pthread_create(&s->th, NULL, worker, s);
  return s;
}

static stream_t *legacy[8];
static __thread stream_t *per_thread[8];

static stream_t *resolve(void *h, int per_thread_default) {
  if ((uintptr_t)h > 2) return h;
  ctx_t *c = cur();
  if (!c) return NULL;
  int ptd = h == (void *)2 || (h == NULL && per_thread_default);
  pthread_mutex_lock(&G);
  stream_t **slot = ptd ? &per_thread[c->dev] : &legacy[c->dev];
  if (!*slot) *slot = stream_new(c);
  stream_t *s = *slot;
  pthread_mutex_unlock(&G);
  return s;
}

static void enqueue(stream_t *s, op_t *o) {
  if (forked) {
    run_op(o);
    free(o);
    return;
  }
  pthread_mutex_lock(&G);
  o->next = NULL;
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  s->enq++;
  pthread_cond_broadcast(&C);
  pthread_mutex_unlock(&G);
}

static void sync_stream(stream_t *s) {
  if (forked) return;
  pthread_mutex_lock(&G);
  uint64_t want = s->enq;
  while (s->done < want) pthread_cond_wait(&C, &G);
  pthread_mutex_unlock(&G);
}

static void child(void) {
  forked = 1;
  pthread_mutex_init(&G, NULL);
  pthread_cond_init(&C, NULL);
}

/* ---- memory ----------------------------------------------------------------------------------- */
enum { MEM_DEVICE = 1, MEM_PINNED = 2, MEM_REGISTERED = 3 };
typedef struct { uintptr_t base; size_t size; int kind, dev; } region_t;
static region_t regions[4096];
static int nregions;
static pthread_mutex_t R = PTHREAD_MUTEX_INITIALIZER;

static void add_region(void *p, size_t n, int kind, int dev) {
  pthread_mutex_lock(&R);
  regions[nregions++] = (region_t){(uintptr_t)p, n, kind, dev};
  pthread_mutex_unlock(&R);
}
static int drop_region(const void *p, int kind) {
  pthread_mutex_lock(&R);
  for (int i = 0; i < nregions; ++i)
    if (regions[i].base == (uintptr_t)p && (regions[i].kind == kind || (kind == MEM_PINNED && regions[i].kind != MEM_DEVICE))) {
      regions[i] = regions[--nregions];
      pthread_mutex_unlock(&R);
      return 1;
    }
  pthread_mutex_unlock(&R);
  return 0;
}
static int find_region(uintptr_t p, region_t *out) {
  pthread_mutex_lock(&R);
  for (int i = 0; i < nregions; ++i)
    if (p >= regions[i].base && p < regions[i].base + regions[i].size) {
      *out = regions[i];
      pthread_mutex_unlock(&R);
      return 1;
    }
  pthread_mutex_unlock(&R);
  return 0;
}
/* A device range [p, p+n) must lie in one device allocation. */
static int device_ok(uintptr_t p, size_t n) {
  region_t r;
  return find_region(p, &r) && r.kind == MEM_DEVICE && p + n <= r.base + r.size;
}

/* ---- counters and injected failures ------------------------------------------------------------ */
enum { F_HTOD, F_DTOH, F_HTOD_ASYNC, F_DTOH_ASYNC, F_MEMCPY, F_MEMCPY_ASYNC, F_PEER_ASYNC, F_N };
static const char *fnames[F_N] = {"cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
                                  "cuMemcpy", "cuMemcpyAsync", "cuMemcpyPeerAsync"};
static uint64_t calls[F_N];
static int inject_engine, inject_all;  /* CUresult to fail with (0: none) */

API uint64_t fakecuda_calls(const char *name) {
  for (int i = 0; i < F_N; ++i)
    if (!strcmp(fnames[i], name)) return __atomic_load_n(&calls[i], __ATOMIC_RELAXED);
  return 0;
}
/* which: "engine" fails cuMemcpy{HtoD,DtoH,Peer}Async (what the engine issues), "all" every copy. */
API void fakecuda_inject(const char *which, int code) {
  if (!strcmp(which, "all")) inject_all = code;
  else inject_engine = code;
}

static int null_copies = -1;  /* FAKECUDA_NULL_COPIES=1: copies do nothing (the call-overhead benchmark) */

static CUresult copy(int f, void *dst, const void *src, size_t n, void *hs, int ptd, int async) {
  if (null_copies < 0) null_copies = getenv("FAKECUDA_NULL_COPIES") != NULL;
  if (null_copies) return OK;
  __atomic_fetch_add(&calls[f], 1, __ATOMIC_RELAXED);
  if (inject_all) return inject_all;
  if (inject_engine && (f == F_HTOD_ASYNC || f == F_DTOH_ASYNC || f == F_PEER_ASYNC)) return inject_engine;
  if ((f == F_HTOD || f == F_HTOD_ASYNC) && !device_ok((uintptr_t)dst, n)) return EINVAL;
  if ((f == F_DTOH || f == F_DTOH_ASYNC) && !device_ok((uintptr_t)src, n)) return EINVAL;
  region_t r;
  if ((f == F_MEMCPY || f == F_MEMCPY_ASYNC) &&
      ((find_region((uintptr_t)dst, &r) && r.kind == MEM_DEVICE && !device_ok((uintptr_t)dst, n)) ||
       (find_region((uintptr_t)src, &r) && r.kind == MEM_DEVICE && !device_ok((uintptr_t)src, n))))
    return EINVAL;
  stream_t *s = resolve(hs, ptd);
  if (!s) return EINVALCTX;
  op_t *o = calloc(1, sizeof *o);
  o->type = OP_COPY;
  o->dst = dst;
  o->src = src;
  o->n = n;
  enqueue(s, o);
  if (!async) sync_stream(s);
  return OK;
}

#define P(x) ((void *)(uintptr_t)(x))
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return copy(F_HTOD, P(d), s, n, 0, 0, 0); }
API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n) { return copy(F_HTOD, P(d), s, n, 0, 1, 0); }
API CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return copy(F_DTOH, d, P(s), n, 0, 0, 0); }
API CUresult cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n) { return copy(F_DTOH, d, P(s), n, 0, 1, 0); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { return copy(F_HTOD_ASYNC, P(d), s, n, st, 0, 1); }
API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n, void *st) { return copy(F_HTOD_ASYNC, P(d), s, n, st, 1, 1); }
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { return copy(F_DTOH_ASYNC, d, P(s), n, st, 0, 1); }
API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, void *st) { return copy(F_DTOH_ASYNC, d, P(s), n, st, 1, 1); }
API CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(F_MEMCPY, P(d), P(s), n, 0, 0, 0); }
API CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(F_MEMCPY, P(d), P(s), n, 0, 1, 0); }
API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { return copy(F_MEMCPY_ASYNC, P(d), P(s), n, st, 0, 1); }
API CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { return copy(F_MEMCPY_ASYNC, P(d), P(s), n, st, 1, 1); }
API CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dc, CUdeviceptr s, void *sc, size_t n, void *st) {
  (void)dc, (void)sc;
  return copy(F_PEER_ASYNC, P(d), P(s), n, st, 0, 1);
}

/* ---- the rest of the driver the engine and the preload use -------------------------------------- */
API CUresult cuInit(unsigned f) {
  (void)f;
  const char *g = getenv("FAKECUDA_GPUS");
  if (g) ngpus = atoi(g) < 1 ? 1 : atoi(g) > 8 ? 8 : atoi(g);
  for (int i = 0; i < 8; ++i) ctxs[i].dev = i;
  static int once;
  if (!__atomic_exchange_n(&once, 1, __ATOMIC_SEQ_CST)) pthread_atfork(NULL, NULL, child);
  return OK;
}
API CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
API CUresult cuDeviceGetCount(int *n) { *n = ngpus; return OK; }
API CUresult cuDeviceGet(int *d, int i) { if (i < 0 || i >= ngpus) return EINVAL; *d = i; return OK; }
API CUresult cuDeviceGetName(char *b, int len, int d) { snprintf(b, (size_t)len, "fake GPU %d", d); return OK; }
/* FAKECUDA_RETAIN_DELAY_MS: the first retain made off the main thread (the preload's engine start on
 * its own thread) takes this long, as a real context creation takes time. */
API CUresult cuDevicePrimaryCtxRetain(void **c, int d) {
  static _Atomic int delayed;
  const char *ms = getenv("FAKECUDA_RETAIN_DELAY_MS");
  if (ms && syscall(SYS_gettid) != getpid() && !atomic_exchange(&delayed, 1)) {
    struct timespec ts = {atoi(ms) / 1000, (long)(atoi(ms) % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  *c = &ctxs[d];
  return OK;
}
API CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return OK; }
API CUresult cuCtxSetCurrent(void *c) {
  if (!c) { ctx_depth = 0; return OK; }
  if (!ctx_depth) ctx_depth = 1;
  ctx_stack[ctx_depth - 1] = c;
  return OK;
}
API CUresult cuCtxGetCurrent(void **c) { *c = cur(); return OK; }
API CUresult cuCtxPushCurrent_v2(void *c) { if (ctx_depth == 16) return EINVAL; ctx_stack[ctx_depth++] = c; return OK; }
API CUresult cuCtxPopCurrent_v2(void **c) { if (!ctx_depth) return EINVALCTX; *c = ctx_stack[--ctx_depth]; return OK; }
API CUresult cuDeviceCanAccessPeer(int *can, int a, int b) { *can = a != b; return OK; }
API CUresult cuCtxEnablePeerAccess(void *c, unsigned f) { (void)c, (void)f; return OK; }
API CUresult cuStreamCreate(void **s, unsigned f) { (void)f; if (!cur()) return EINVALCTX; *s = stream_new(cur()); return OK; }
API CUresult cuStreamDestroy_v2(void *h) {
  stream_t *s = h;
  sync_stream(s);
  pthread_mutex_lock(&G);
  s->stop = 1;
  pthread_cond_broadcast(&C);
  pthread_mutex_unlock(&G);
  if (!forked) pthread_join(s->th, NULL);
  free(s);
  return OK;
}
API CUresult cuStreamGetCtx(void *h, void **c) {
  stream_t *s = resolve(h, 0);
  if (!s) return EINVALCTX;
  *c = s->ctx;
  return OK;
}
API CUresult cuStreamSynchronize(void *h) { stream_t *s = resolve(h, 0); if (!s) return EINVALCTX; sync_stream(s); return OK; }
API CUresult cuStreamQuery(void *h) {
  stream_t *s = resolve(h, 0);
  if (!s) return EINVALCTX;
  pthread_mutex_lock(&G);
  int busy = s->done < s->enq;
  pthread_mutex_unlock(&G);
  return busy ? ENOTREADY : OK;
}
API CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = calloc(1, sizeof(event_t)); return OK; }
API CUresult cuEventDestroy_v2(void *e) { free(e); return OK; }
API CUresult cuEventRecord(void *e, void *h) {
  stream_t *s = resolve(h, 0);
  if (!s) return EINVALCTX;
  event_t *ev = e;
  op_t *o = calloc(1, sizeof *o);
  o->type = OP_RECORD;
  o->ev = ev;
  pthread_mutex_lock(&G);
  o->target = ++ev->recorded;
  pthread_mutex_unlock(&G);
  enqueue(s, o);
  return OK;
}
API CUresult cuEventQuery(void *e) {
  event_t *ev = e;
  pthread_mutex_lock(&G);
  int done = forked || ev->completed >= ev->recorded;
  pthread_mutex_unlock(&G);
  return done ? OK : ENOTREADY;
}
API CUresult cuEventSynchronize(void *e) {
  event_t *ev = e;
  if (forked) return OK;
  pthread_mutex_lock(&G);
  uint64_t want = ev->recorded;
  while (ev->completed < want) pthread_cond_wait(&C, &G);
  pthread_mutex_unlock(&G);
  return OK;
}
API CUresult cuStreamWaitEvent(void *h, void *e, unsigned f) {
  (void)f;
  stream_t *s = resolve(h, 0);
  if (!s) return EINVALCTX;
  event_t *ev = e;
  op_t *o = calloc(1, sizeof *o);
  o->type = OP_WAIT_EVENT;
  o->ev = ev;
  pthread_mutex_lock(&G);
  o->target = ev->recorded;
  pthread_mutex_unlock(&G);
  enqueue(s, o);
  return OK;
}
API CUresult cuStreamWaitValue32_v2(void *h, CUdeviceptr addr, uint32_t v, unsigned f) {
  if (f != 0) return EINVAL; /* the fake knows GEQ only */
  if (getenv("FAKECUDA_NO_MEMOPS")) return ENOTSUP;
  stream_t *s = resolve(h, 0);
  if (!s) return EINVALCTX;
  op_t *o = calloc(1, sizeof *o);
  o->type = OP_WAIT_VALUE;
  o->flag = (volatile uint32_t *)P(addr);
  o->value = v;
  enqueue(s, o);
  return OK;
}
API CUresult cuLaunchHostFunc(void *h, void (*fn)(void *), void *arg) {
  stream_t *s = resolve(h, 0);
  if (!s) return EINVALCTX;
  op_t *o = calloc(1, sizeof *o);
  o->type = OP_HOSTFN;
  o->fn = fn;
  o->arg = arg;
  enqueue(s, o);
  return OK;
}
/* A kernel-like operation: fn(arg) runs on the stream's worker in stream order. */
API CUresult fakecuda_launch(void *h, void (*fn)(void *), void *arg) { return cuLaunchHostFunc(h, fn, arg); }

API CUresult cuStreamBeginCapture_v2(void *h, int mode) { (void)mode; stream_t *s = resolve(h, 0); if (!s) return EINVALCTX; s->capturing = 1; return OK; }
API CUresult cuStreamEndCapture(void *h, void **graph) { stream_t *s = resolve(h, 0); if (!s) return EINVALCTX; s->capturing = 0; *graph = NULL; return OK; }
API CUresult cuStreamIsCapturing(void *h, int *status) { stream_t *s = resolve(h, 0); if (!s) return EINVALCTX; *status = s->capturing; return OK; }

static void *aligned(size_t n) {
  void *p = NULL;
  return posix_memalign(&p, 4096, n ? n : 1) ? NULL : p;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) {
  if (!cur()) return EINVALCTX;
  void *p = aligned(n);
  if (!p) return 2;
  add_region(p, n, MEM_DEVICE, cur()->dev);
  *d = (CUdeviceptr)(uintptr_t)p;
  return OK;
}
API CUresult cuMemFree_v2(CUdeviceptr d) { if (!drop_region(P(d), MEM_DEVICE)) return EINVAL; free(P(d)); return OK; }
API CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) {
  (void)f;
  *p = aligned(n);
  if (!*p) return 2;
  add_region(*p, n, MEM_PINNED, -1);
  return OK;
}
API CUresult cuMemFreeHost(void *p) { if (!drop_region(p, MEM_PINNED)) return EINVAL; free(p); return OK; }
API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) { (void)f; add_region(p, n, MEM_REGISTERED, -1); return OK; }
API CUresult cuMemHostUnregister(void *p) { return drop_region(p, MEM_REGISTERED) ? OK : EINVAL; }
API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned f) { (void)f; *d = (CUdeviceptr)(uintptr_t)p; return OK; }
API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr) {
  region_t r;
  if (!find_region((uintptr_t)ptr, &r)) return EINVAL;
  switch (attr) {
    case 1: *(void **)data = r.kind == MEM_DEVICE ? (void *)&ctxs[r.dev] : (void *)&ctxs[0]; return OK;
    case 2: *(unsigned *)data = r.kind == MEM_DEVICE ? 2 : 1; return OK;
    case 8: *(unsigned *)data = 0; return OK;
    case 9: *(int *)data = r.kind == MEM_DEVICE ? r.dev : 0; return OK;
    case 11: *(CUdeviceptr *)data = r.base; return OK;
    case 12: *(size_t *)data = r.size; return OK;
    default: return EINVAL;
  }
}
API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  region_t r;
  if (!find_region((uintptr_t)p, &r) || r.kind != MEM_DEVICE) return EINVAL;
  if (base) *base = r.base;
  if (size) *size = r.size;
  return OK;
}
API CUresult cuGetErrorName(CUresult r, const char **s) {
  static char buf[64];
  snprintf(buf, sizeof buf, "FAKE_CUDA_ERROR_%d", r);
  *s = buf;
  return OK;
}

/* ---- cuGetProcAddress: base names, per-thread variants on request ------------------------------- */
typedef struct { const char *base; void *legacy, *per_thread; } entry_t;
API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);
API CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags);
#define E1(b, f) {b, (void *)f, NULL}
#define E2(b, f, g) {b, (void *)f, (void *)g}
static const entry_t table[] = {
    E1("cuInit", cuInit), E1("cuDriverGetVersion", cuDriverGetVersion), E1("cuDeviceGetCount", cuDeviceGetCount),
    E1("cuDeviceGet", cuDeviceGet), E1("cuDeviceGetName", cuDeviceGetName),
    E1("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain), E1("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2),
    E1("cuCtxSetCurrent", cuCtxSetCurrent), E1("cuCtxGetCurrent", cuCtxGetCurrent),
    E1("cuCtxPushCurrent", cuCtxPushCurrent_v2), E1("cuCtxPopCurrent", cuCtxPopCurrent_v2),
    E1("cuDeviceCanAccessPeer", cuDeviceCanAccessPeer), E1("cuCtxEnablePeerAccess", cuCtxEnablePeerAccess),
    E1("cuStreamCreate", cuStreamCreate), E1("cuStreamDestroy", cuStreamDestroy_v2), E1("cuStreamGetCtx", cuStreamGetCtx),
    E1("cuStreamSynchronize", cuStreamSynchronize), E1("cuStreamQuery", cuStreamQuery),
    E1("cuEventCreate", cuEventCreate), E1("cuEventDestroy", cuEventDestroy_v2), E1("cuEventRecord", cuEventRecord),
    E1("cuEventQuery", cuEventQuery), E1("cuEventSynchronize", cuEventSynchronize), E1("cuStreamWaitEvent", cuStreamWaitEvent),
    E1("cuStreamWaitValue32", cuStreamWaitValue32_v2), E1("cuLaunchHostFunc", cuLaunchHostFunc),
    E1("cuStreamBeginCapture", cuStreamBeginCapture_v2), E1("cuStreamEndCapture", cuStreamEndCapture),
    E1("cuStreamIsCapturing", cuStreamIsCapturing),
    E1("cuMemAlloc", cuMemAlloc_v2), E1("cuMemFree", cuMemFree_v2), E1("cuMemHostAlloc", cuMemHostAlloc),
    E1("cuMemFreeHost", cuMemFreeHost), E1("cuMemHostRegister", cuMemHostRegister_v2),
    E1("cuMemHostUnregister", cuMemHostUnregister), E1("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2),
    E1("cuPointerGetAttribute", cuPointerGetAttribute), E1("cuMemGetAddressRange", cuMemGetAddressRange_v2),
    E1("cuGetErrorName", cuGetErrorName), E1("cuMemcpyPeerAsync", cuMemcpyPeerAsync),
    E2("cuMemcpyHtoD", cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds), E2("cuMemcpyDtoH", cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    E2("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    E2("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    E2("cuMemcpy", cuMemcpy, cuMemcpy_ptds), E2("cuMemcpyAsync", cuMemcpyAsync, cuMemcpyAsync_ptsz),
};

API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
  (void)ver;
  *pfn = NULL;
  if (!strcmp(sym, "cuGetProcAddress")) *pfn = ver >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
  for (size_t i = 0; i < sizeof table / sizeof *table && !*pfn; ++i)
    if (!strcmp(table[i].base, sym)) *pfn = (flags & 2) && table[i].per_thread ? table[i].per_thread : table[i].legacy;
  if (status) *status = *pfn ? 0 : 1;
  return OK;
}
API CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
  return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
