/* Drives libgpudash_preload.so's three doors against the fake libcudart.so.13 / libcuda.so.1 and checks
 * what the stats block says was taken or passed, the bytes, stream order, pass-through, the kill
 * switch, fork children, exit, live knobs and errors. One scenario per run (argv[1]); exit 0 = passed.
 * The test runs it with the knobs: chunks 64 KiB, fallback 256 KiB, staging 128 KiB (so 1 MiB pageable
 * copies are staged, 1 MiB pinned ones multipath over the two fake GPUs, 4 KiB ones pass). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpudash_preload_shm.h"

typedef unsigned long long CUdeviceptr;
int cudaMemcpy(void *, const void *, size_t, int);
int cudaMemcpy_ptds(void *, const void *, size_t, int);
int cudaMemcpyAsync(void *, const void *, size_t, int, void *);
int cudaMemcpyAsync_ptsz(void *, const void *, size_t, int, void *);
int cudaMalloc(void **, size_t);
int cudaMallocHost(void **, size_t);
int cudaStreamCreate(void **);
int cudaStreamSynchronize(void *);
int cudaStreamBeginCapture(void *, int);
int cudaStreamEndCapture(void *, void **);
int cudaSetDevice(int);
int fakecuda_launch(void *, void (*)(void *), void *);
unsigned long long fakecuda_calls(const char *);
void fakecuda_inject(const char *, int);

enum { H2D = 1, D2H = 2, D2D = 3 };
#define MB (1u << 20)
#define CHECK(c)                                                                  \
  do {                                                                            \
    if (!(c)) {                                                                   \
      fprintf(stderr, "FAILED line %d: %s\n", __LINE__, #c);                      \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

static void fill(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; ++i) b[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 9));
}
static int same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* ---- the stats block ---------------------------------------------------------------------- */
static gp_stats_block *stats_map(pid_t pid) {
  char name[64];
  snprintf(name, sizeof name, GPUDASH_PRELOAD_STATS_FMT, (int)pid);
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) return NULL;
  void *p = mmap(NULL, sizeof(gp_stats_block), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? NULL : p;
}
static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}
/* A consistent copy published after this call began (the publisher runs every few ms in the test). */
static gp_stats_block S;
static gp_stats_block *fresh(void) {
  static gp_stats_block *m;
  if (!m) m = stats_map(getpid());
  CHECK(m != NULL);
  double t = wall();
  for (int i = 0; i < 5000; ++i) {
    uint64_t s1 = __atomic_load_n(&m->seq, __ATOMIC_ACQUIRE);
    if (!(s1 & 1)) {
      memcpy(&S, m, sizeof S);
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (__atomic_load_n(&m->seq, __ATOMIC_RELAXED) == s1 && S.updated_at > t) return &S;
    }
    nap_ms(1);
  }
  CHECK(!"the stats block was not published");
  return NULL;
}

/* What the stats must say: [dir] taken, passed, bytes taken, bytes passed, staged, errors. */
static uint64_t want[2][6];
static void expect(int dir, int taken, size_t n, int staged) {
  want[dir][taken ? 0 : 1] += 1;
  want[dir][taken ? 2 : 3] += n;
  if (staged) want[dir][4] += 1;
}
static void check_counts(int line) {
  gp_stats_block *s = fresh();
  for (int d = 0; d < 2; ++d) {
    gp_direction_stats *x = &s->dir[d];
    uint64_t got[6] = {x->copies_taken, x->copies_passed, x->bytes_taken, x->bytes_passed, x->staged_copies, x->errors};
    for (int i = 0; i < 6; ++i)
      if (got[i] != want[d][i]) {
        fprintf(stderr, "FAILED line %d: dir %d counter %d is %llu, expected %llu\n", line, d, i,
                (unsigned long long)got[i], (unsigned long long)want[d][i]);
        exit(1);
      }
  }
}
#define COUNTS() check_counts(__LINE__)

/* ---- kernel-like operations ------------------------------------------------------------------ */
typedef struct {
  volatile int go;     /* the operation waits for it (0: runs at once) */
  int wait;
  void *dst;
  const void *src;
  size_t n;
  volatile int ran;
} kop;
static void kernel(void *arg) {
  kop *k = arg;
  while (k->wait && !k->go) nap_ms(1);
  if (k->dst) memcpy(k->dst, k->src, k->n);
  k->ran = 1;
}

static void *dev, *dev2, *small_dev, *pin, *pin2, *page, *page2, *pattern, *seen;
static void setup(void) {
  CHECK(cudaSetDevice(0) == 0);
  CHECK(cudaMalloc(&dev, 2 * MB) == 0 && cudaMalloc(&dev2, 2 * MB) == 0 && cudaMalloc(&small_dev, MB / 2) == 0);
  CHECK(cudaMallocHost(&pin, 2 * MB) == 0 && cudaMallocHost(&pin2, 2 * MB) == 0);
  page = malloc(2 * MB), page2 = malloc(2 * MB), pattern = malloc(2 * MB), seen = malloc(2 * MB);
}

/* A pinned async copy on a stream whose earlier work is still blocked: the call returns at once, the
 * copy reads only after that work, and later work sees the copied bytes. */
static void pinned_async_order(int (*copy)(void *, const void *, size_t, int, void *), void *s, int dir) {
  fill(pattern, MB, 40 + (unsigned)dir);
  kop first = {0, 1, NULL, pattern, MB, 0}, later = {0, 0, seen, NULL, MB, 0};
  memset(seen, 0, MB);
  if (dir == H2D) {
    memset(pin, 0, MB);
    memset(dev, 0, MB);
    first.dst = pin;   /* the earlier work writes the source */
    later.src = dev;   /* the later work reads the destination */
    CHECK(fakecuda_launch(s, kernel, &first) == 0);
    CHECK(copy(dev, pin, MB, H2D, s) == 0);
  } else {
    memset(dev, 0, MB);
    memset(pin, 0, MB);
    first.dst = dev;
    later.src = pin;
    CHECK(fakecuda_launch(s, kernel, &first) == 0);
    CHECK(copy(pin, dev, MB, D2H, s) == 0);
  }
  CHECK(fakecuda_launch(s, kernel, &later) == 0);
  CHECK(!first.ran);  /* the call returned while the work ahead of it was still held */
  CHECK(same(dir == H2D ? dev : pin, (char[4096]){0}, 4096));
  first.go = 1;
  CHECK(cudaStreamSynchronize(s) == 0);
  CHECK(later.ran && same(dir == H2D ? dev : pin, pattern, MB) && same(seen, pattern, MB));
  expect(dir == H2D ? 0 : 1, 1, MB, 0);
}

/* A pageable async copy waits for the work ahead of it and returns once the bytes are in place. */
static void pageable_async_order(void *s) {
  fill(pattern, MB, 77);
  memset(page, 0, MB);
  kop first = {0, 0, page, pattern, MB, 0};
  CHECK(fakecuda_launch(s, kernel, &first) == 0);
  CHECK(cudaMemcpyAsync(dev, page, MB, H2D, s) == 0);
  CHECK(first.ran && same(dev, pattern, MB));
  expect(0, 1, MB, 1);
}

static int scenario_doors(void) {
  setup();
  void *s;
  CHECK(cudaStreamCreate(&s) == 0);
  /* door 1: PLT calls into cudart, every variant */
  fill(page, MB, 1);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB));
  expect(0, 1, MB, 1);
  CHECK(cudaMemcpy(page2, dev, MB, D2H) == 0 && same(page2, page, MB));
  expect(1, 1, MB, 1);
  fill(page, MB, 2);
  CHECK(cudaMemcpy_ptds(dev, page, MB, 4 /* Default */) == 0 && same(dev, page, MB));
  expect(0, 1, MB, 1);
  CHECK(cudaMemcpyAsync_ptsz(page2, dev, MB, D2H, NULL) == 0 && same(page2, page, MB));
  expect(1, 1, MB, 1);
  COUNTS();
  gp_stats_block *st = fresh();
  CHECK(st->magic == GPUDASH_PRELOAD_MAGIC && st->state == GP_STATE_ACTIVE && st->pid == getpid());
  CHECK(!strcmp(st->name, "test-server") && st->num_gpus == 2 && st->num_paths == 8);
  CHECK(st->knobs.h2d_chunk_bytes == 65536 && st->h2d_staging_bytes == 131072 && st->knobs.staging_threads == 2);
  CHECK(st->dir[0].ns_in_calls_taken > 0 && st->dir[0].ns_to_landed_taken > 0);
  /* stream order, pinned (multipath, returns at once) and pageable (synchronous) */
  pinned_async_order(cudaMemcpyAsync, s, H2D);
  pinned_async_order(cudaMemcpyAsync, s, D2H);
  pinned_async_order(cudaMemcpyAsync_ptsz, s, H2D);
  pageable_async_order(s);
  COUNTS();
  /* pinned synchronous copy: multipath, blocks */
  fill(pin, MB, 3);
  CHECK(cudaMemcpy(dev2, pin, MB, H2D) == 0 && same(dev2, pin, MB));
  expect(0, 1, MB, 0);
  /* the PLT binds to the preload; RTLD_NEXT still means "after the caller" through the dlsym hook */
  Dl_info info;
  CHECK(dladdr((void *)cudaMemcpy, &info) && strstr(info.dli_fname, "libgpudash_preload"));
  CHECK(dlsym(RTLD_NEXT, "cudaMemcpy") == (void *)cudaMemcpy);
  /* door 2: dlsym on a cudart handle (as ctypes does) */
  void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
  CHECK(h != NULL);
  int (*dl_memcpy)(void *, const void *, size_t, int) = (int (*)(void *, const void *, size_t, int))dlsym(h, "cudaMemcpy");
  CHECK(dl_memcpy != NULL);
  CHECK(dlsym(h, "cudaMalloc") == (void *)cudaMalloc);  /* everything else is the library's own */
  fill(page, MB, 4);
  CHECK(dl_memcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB));
  expect(0, 1, MB, 1);
  COUNTS();
  /* door 3: the driver table from cuGetProcAddress (as a statically linked cudart reaches it) */
  void *hc = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(hc != NULL);
  int (*gpa)(const char *, void **, int, unsigned long long, int *) =
      (int (*)(const char *, void **, int, unsigned long long, int *))dlsym(hc, "cuGetProcAddress_v2");
  CHECK(gpa != NULL);
  int (*htod)(CUdeviceptr, const void *, size_t) = NULL;
  int (*dtoh_async)(void *, CUdeviceptr, size_t, void *) = NULL;
  void *alloc = NULL;
  int status = 0;
  CHECK(gpa("cuMemcpyHtoD", (void **)&htod, 13000, 0, &status) == 0 && htod);
  CHECK(gpa("cuMemcpyDtoHAsync", (void **)&dtoh_async, 13000, 2 /* per-thread */, &status) == 0 && dtoh_async);
  CHECK(dladdr((void *)dtoh_async, &info) && strstr(info.dli_fname, "libgpudash_preload"));  /* ours */
  CHECK(gpa("cuMemAlloc", &alloc, 13000, 0, &status) == 0 && alloc == dlsym(hc, "cuMemAlloc_v2"));
  fill(page, MB, 5);
  CHECK(htod((CUdeviceptr)(uintptr_t)dev, page, MB) == 0 && same(dev, page, MB));
  expect(0, 1, MB, 1);
  fill(dev, MB, 6);
  CHECK(dtoh_async(pin2, (CUdeviceptr)(uintptr_t)dev, MB, s) == 0);  /* pinned: gated on s */
  CHECK(cudaStreamSynchronize(s) == 0 && same(pin2, dev, MB));
  expect(1, 1, MB, 0);
  int (*unified)(CUdeviceptr, CUdeviceptr, size_t) = NULL;  /* direction from the pointers */
  int (*unified_async)(CUdeviceptr, CUdeviceptr, size_t, void *) = NULL;
  CHECK(gpa("cuMemcpy", (void **)&unified, 13000, 0, &status) == 0 && unified);
  CHECK(gpa("cuMemcpyAsync", (void **)&unified_async, 13000, 2, &status) == 0 && unified_async);
  fill(page2, MB, 10);
  CHECK(unified((CUdeviceptr)(uintptr_t)page2, (CUdeviceptr)(uintptr_t)dev, MB) == 0 && same(page2, dev, MB));
  expect(1, 1, MB, 1);
  fill(pin, MB, 24);
  CHECK(unified_async((CUdeviceptr)(uintptr_t)dev2, (CUdeviceptr)(uintptr_t)pin, MB, s) == 0);
  CHECK(cudaStreamSynchronize(s) == 0 && same(dev2, pin, MB));
  expect(0, 1, MB, 0);
  COUNTS();
  /* passed through: device to device, small copies, copies while the stream is captured */
  fill(dev2, MB, 7);
  CHECK(cudaMemcpy(dev, dev2, MB, D2D) == 0 && same(dev, dev2, MB));
  fill(page, 4096, 8);
  CHECK(cudaMemcpy(dev, page, 4096, H2D) == 0 && same(dev, page, 4096));
  expect(0, 0, 4096, 0);
  CHECK(cudaStreamBeginCapture(s, 0) == 0);
  fill(page, MB, 9);
  CHECK(cudaMemcpyAsync(dev, page, MB, H2D, s) == 0);
  void *graph;
  CHECK(cudaStreamEndCapture(s, &graph) == 0 && cudaStreamSynchronize(s) == 0 && same(dev, page, MB));
  expect(0, 0, MB, 0);
  /* an error the original reports comes back as its CUDA code: 1 MiB into a 512 KiB allocation */
  CHECK(cudaMemcpy(small_dev, page, MB, H2D) == 1 /* cudaErrorInvalidValue */);
  expect(0, 0, MB, 0);
  want[0][5] += 1;
  CHECK(htod((CUdeviceptr)(uintptr_t)small_dev, page, MB) == 1 /* CUDA_ERROR_INVALID_VALUE */);
  expect(0, 0, MB, 0);
  want[0][5] += 1;
  COUNTS();
  /* why: the captured copy, and the two past the end of their allocation (D2D and 4 KiB need no decision) */
  for (int why = 0; why < GP_WHY_N; ++why)
    CHECK(S.dir[0].passed_why[why] == (why == GP_WHY_CAPTURE ? 1u : why == GP_WHY_RANGE ? 2u : 0u) &&
          S.dir[1].passed_why[why] == 0);
  return 0;
}

/* The engine fails: a synchronous copy is redone by the original, an async pinned one by the driver on a
 * private stream; when the original fails too, the caller gets its error code. */
static int scenario_engine_fails(void) {
  setup();
  void *s;
  CHECK(cudaStreamCreate(&s) == 0);
  fakecuda_inject("engine", 719 /* LAUNCH_FAILED */);
  fill(page, MB, 11);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB));
  expect(0, 0, MB, 0);
  fill(pin, MB, 12);
  CHECK(cudaMemcpyAsync(dev2, pin, MB, H2D, s) == 0);
  CHECK(cudaStreamSynchronize(s) == 0 && same(dev2, pin, MB));
  gp_stats_block *st = fresh();
  CHECK(st->dir[0].errors == 0);
  fakecuda_inject("all", 719);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 719);
  CHECK(fresh()->dir[0].errors == 1);
  return 0;
}

/* Without stream memory ops the gate is a host function that holds the stream. */
static int scenario_hostfunc(void) {
  setup();
  void *s;
  CHECK(cudaStreamCreate(&s) == 0);
  pinned_async_order(cudaMemcpyAsync, s, H2D);
  pinned_async_order(cudaMemcpyAsync, s, D2H);
  COUNTS();
  return 0;
}

/* GPUDASH_PRELOAD=off, or an engine that cannot start: everything passes, the bytes are right. */
static int scenario_passthrough(int state) {
  setup();
  fill(page, MB, 13);
  unsigned long long before = fakecuda_calls("cuMemcpy");
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB));
  CHECK(cudaMemcpy(page2, dev, MB, D2H) == 0 && same(page2, page, MB));
  CHECK(fakecuda_calls("cuMemcpy") == before + 2);
  expect(0, 0, MB, 0);
  expect(1, 0, MB, 0);
  COUNTS();
  CHECK(S.state == state);
  return 0;
}

/* The knob block: a new generation is applied, a refused one is reported, enabled=0 stops taking. */
static gp_knobs_block *knobs_map(void) {
  char name[64];
  snprintf(name, sizeof name, GPUDASH_PRELOAD_KNOBS_FMT, (int)getpid());
  int fd = shm_open(name, O_RDWR, 0);
  CHECK(fd >= 0);
  void *p = mmap(NULL, sizeof(gp_knobs_block), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  CHECK(p != MAP_FAILED);
  return p;
}
static void knobs_write(gp_knobs_block *k, const gp_knobs_block *v) {
  __atomic_store_n(&k->seq, k->seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  k->generation = v->generation;
  k->knobs = v->knobs;
  k->h2d_staging_bytes = v->h2d_staging_bytes;
  k->d2h_staging_bytes = v->d2h_staging_bytes;
  k->enabled = v->enabled;
  __atomic_store_n(&k->seq, k->seq + 1, __ATOMIC_RELEASE);
}
static int scenario_knobs(void) {
  setup();
  fill(page, MB, 14);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0);
  expect(0, 1, MB, 1);
  gp_knobs_block *k = knobs_map(), v;
  CHECK(k->magic == GPUDASH_PRELOAD_MAGIC && k->generation == 0 && k->enabled == 1);
  CHECK(k->knobs.h2d_chunk_bytes == 65536 && k->h2d_staging_bytes == 131072);
  memcpy(&v, k, sizeof v);
  v.generation = 1;
  v.h2d_staging_bytes = 4 * MB;  /* 1 MiB pageable H2D now passes */
  v.knobs.staging_threads = 3;
  knobs_write(k, &v);
  while (fresh()->knobs_generation != 1) nap_ms(1);
  CHECK(S.h2d_staging_bytes == 4 * MB && S.knobs.staging_threads == 3);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB));
  expect(0, 0, MB, 0);
  v.generation = 2;
  v.knobs.outstanding = 0;  /* out of range: refused */
  knobs_write(k, &v);
  while (__atomic_load_n(&k->rejected_generation, __ATOMIC_ACQUIRE) != 2) nap_ms(1);
  CHECK(fresh()->knobs_generation == 1 && S.knobs.outstanding == 2);
  v.knobs.outstanding = 2;
  v.enabled = 0;
  knobs_write(k, &v);  /* generation 2 again: only the switch changes */
  while (fresh()->state != GP_STATE_OFF) nap_ms(1);
  CHECK(cudaMemcpy(page2, dev, MB, D2H) == 0 && same(page2, page, MB));
  expect(1, 0, MB, 0);
  COUNTS();
  return 0;
}

/* A fork() child passes every copy to the original; the parent keeps its blocks and its engine. */
static int scenario_fork(void) {
  setup();
  fill(page, MB, 15);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0);
  expect(0, 1, MB, 1);
  pid_t pid = fork();
  if (pid == 0) {
    unsigned long long before = fakecuda_calls("cuMemcpy");
    fill(page, MB, 16);
    int ok = cudaMemcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB) && fakecuda_calls("cuMemcpy") == before + 1;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(stats_map(getpid()) != NULL);
  fill(page, MB, 17);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB));
  expect(0, 1, MB, 1);
  COUNTS();
  return 0;
}

/* Once exit() runs the handlers, copies pass to the original (this handler runs after the preload's). */
static void copy_at_exit(void) {
  unsigned long long before = fakecuda_calls("cuMemcpy");
  fill(page, MB, 18);
  if (cudaMemcpy(dev, page, MB, H2D) != 0 || !same(dev, page, MB) || fakecuda_calls("cuMemcpy") != before + 1)
    _exit(3);
  printf("exit-copy passed through\n");
}
static int scenario_exit(void) {
  atexit(copy_at_exit);
  setup();
  fill(page, MB, 19);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0);
  expect(0, 1, MB, 1);
  COUNTS();
  printf("pid %d\n", (int)getpid());
  fflush(stdout);
  return 0;
}

/* Several threads, each on its own stream and buffers, mixing gated pinned copies, staged pageable ones
 * and small passed ones: every byte lands where it should and every copy is counted once. */
#define THREADS 4
#define ROUNDS 12
static void *thread_copies(void *arg) {
  long t = (long)arg;
  void *s, *d, *p;
  if (cudaStreamCreate(&s) || cudaMalloc(&d, MB) || cudaMallocHost(&p, MB)) return (void *)1;
  unsigned char *src = malloc(MB), *back = malloc(MB);
  for (int r = 0; r < ROUNDS; ++r) {
    fill(p, MB, (unsigned)(t * 100 + r));
    if (cudaMemcpyAsync(d, p, MB, H2D, s) || cudaMemcpyAsync(back, d, MB, D2H, s)) return (void *)2;
    if (cudaStreamSynchronize(s) || !same(back, p, MB)) return (void *)3;  /* gated, then staged */
    fill(src, MB, (unsigned)(t * 100 + r + 50));
    if (cudaMemcpy(d, src, MB, H2D) || cudaMemcpyAsync(p, d, MB, D2H, s) || cudaStreamSynchronize(s)) return (void *)4;
    if (!same(p, src, MB)) return (void *)5;
    if (cudaMemcpy(d, src, 4096, H2D) || !same(d, src, 4096)) return (void *)6;
  }
  free(src);
  free(back);
  return NULL;
}
static int scenario_threads(void) {
  setup();
  fill(page, MB, 21);  /* start the engine first: copies that come while it starts pass */
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0);
  expect(0, 1, MB, 1);
  pthread_t th[THREADS];
  for (long t = 0; t < THREADS; ++t) CHECK(pthread_create(&th[t], NULL, thread_copies, (void *)t) == 0);
  for (int t = 0; t < THREADS; ++t) {
    void *rc = NULL;
    CHECK(pthread_join(th[t], &rc) == 0);
    if (rc) fprintf(stderr, "thread %d failed at step %ld\n", t, (long)rc);
    CHECK(rc == NULL);
  }
  for (int i = 0; i < THREADS * ROUNDS; ++i) {
    expect(0, 1, MB, 0);  /* pinned, gated */
    expect(1, 1, MB, 1);  /* pageable, staged */
    expect(0, 1, MB, 1);
    expect(1, 1, MB, 0);
    expect(0, 0, 4096, 0);
  }
  COUNTS();
  return 0;
}

/* One GPU: pinned memory has no second path, so pinned copies pass (unless GPUDASH_PRELOAD_PINNED=always),
 * while pageable ones are still staged. */
static int scenario_one_gpu(int always) {
  setup();
  void *s;
  CHECK(cudaStreamCreate(&s) == 0);
  fill(page, MB, 22);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB));
  expect(0, 1, MB, 1);
  fill(pin, MB, 23);
  CHECK(cudaMemcpyAsync(dev2, pin, MB, H2D, s) == 0 && cudaStreamSynchronize(s) == 0 && same(dev2, pin, MB));
  expect(0, always, MB, 0);
  CHECK(cudaMemcpy(pin2, dev2, MB, D2H) == 0 && same(pin2, pin, MB));
  expect(1, always, MB, 0);
  COUNTS();
  CHECK(S.num_gpus == 1 && S.num_paths == 2);
  CHECK(S.dir[0].passed_why[GP_WHY_PINNED] == (uint64_t)!always && S.dir[1].passed_why[GP_WHY_PINNED] == (uint64_t)!always);
  return 0;
}

/* The start-up knobs the process wrote into its knob block (no GPUDASH_PRELOAD_KNOBS: the defaults). */
/* The first door entry (a small copy that passes) starts the engine on a thread of its own; a big copy
 * that comes while that start is still in progress (FAKECUDA_RETAIN_DELAY_MS slows it) waits for it
 * and is taken, rather than passing or starting a second engine. */
/* A model file's bytes, the two ways loaders hand them to the GPU (one GPU, as most loads run):
 * PyTorch's `.to("cuda")` of a tensor that is a view of the file's mapping (safe_open on the CPU, then
 * .to: the source is the read-only mapping itself, pageable: staged), and safetensors 0.8's load_file on
 * a CUDA device (it copies each tensor out of its mapping into a pinned buffer first: the copy's source
 * is that buffer, and a pinned copy with only the direct path passes, counted under its reason). */
static int scenario_file_source(void) {
  setup();
  void *s;
  CHECK(cudaStreamCreate(&s) == 0);
  char path[4096];
  const char *tmp = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/gpudash-file-source-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  unlink(path);  /* the mappings keep the file */
  fill(pattern, 2 * MB, 31);
  CHECK(write(fd, pattern, 2 * MB) == (ssize_t)(2 * MB));
  const unsigned char *ro = mmap(NULL, 2 * MB, PROT_READ, MAP_PRIVATE, fd, 0);
  const unsigned char *shared = mmap(NULL, 2 * MB, PROT_READ, MAP_SHARED, fd, 0);
  CHECK(ro != MAP_FAILED && shared != MAP_FAILED);
  CHECK(cudaMemcpy(dev, ro, MB, H2D) == 0 && same(dev, pattern, MB));
  expect(0, 1, MB, 1);
  CHECK(cudaMemcpyAsync(dev2, ro + MB, MB, H2D, s) == 0 && same(dev2, pattern + MB, MB));
  expect(0, 1, MB, 1);
  CHECK(cudaMemcpyAsync_ptsz(dev, shared + MB / 2, MB, 4 /* Default */, NULL) == 0 && same(dev, pattern + MB / 2, MB));
  expect(0, 1, MB, 1);
  CHECK(cudaMemcpy(small_dev, ro, 4096, H2D) == 0 && same(small_dev, pattern, 4096));  /* below every threshold */
  expect(0, 0, 4096, 0);
  memcpy(pin, ro, MB);  /* safetensors 0.8: out of the mapping into a pinned buffer, then .to("cuda") */
  CHECK(cudaMemcpyAsync(dev2, pin, MB, H2D, s) == 0 && cudaStreamSynchronize(s) == 0 && same(dev2, pattern, MB));
  expect(0, 0, MB, 0);
  COUNTS();
  CHECK(S.num_gpus == 1);
  for (int why = 0; why < GP_WHY_N; ++why)  /* the 4 KiB copy passed before any decision: no reason */
    CHECK(S.dir[0].passed_why[why] == (why == GP_WHY_PINNED ? 1u : 0u));
  CHECK(S.dir[0].cpu_ns_calls_taken > 0 && S.dir[1].cpu_ns_calls_taken == 0);
  munmap((void *)ro, 2 * MB);
  munmap((void *)shared, 2 * MB);
  close(fd);
  return 0;
}

static int scenario_early_start(void) {
  setup();
  fill(page, 4096, 30);
  CHECK(cudaMemcpy(dev, page, 4096, H2D) == 0 && same(dev, page, 4096));
  expect(0, 0, 4096, 0);
  nap_ms(100);
  fill(page, MB, 31);
  double t0 = wall();
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0 && same(dev, page, MB));
  double in_call = wall() - t0;
  expect(0, 1, MB, 1);
  COUNTS();
  gp_stats_block *st = fresh();
  double start_s = (double)st->engine_start_ns * 1e-9;
  printf("engine start %.3f s, big copy %.3f s in its call\n", start_s, in_call);
  CHECK(start_s >= 0.4);           /* the start ran on the starter thread (the delayed retain) */
  CHECK(in_call < start_s - 0.05);  /* and began before the big copy came */
  return 0;
}

static int scenario_defaults(void) {
  setup();
  fill(page, 4096, 20);
  CHECK(cudaMemcpy(dev, page, 4096, H2D) == 0);  /* the first door entry creates the blocks */
  gp_knobs_block *k = knobs_map();
  printf("h2d_chunk_bytes=%llu\nd2h_chunk_bytes=%llu\nh2d_fallback_bytes=%llu\nd2h_fallback_bytes=%llu\n",
         (unsigned long long)k->knobs.h2d_chunk_bytes, (unsigned long long)k->knobs.d2h_chunk_bytes,
         (unsigned long long)k->knobs.h2d_fallback_bytes, (unsigned long long)k->knobs.d2h_fallback_bytes);
  printf("outstanding=%d\ndirect_first=%d\nstaging_threads=%d\nh2d_staging_bytes=%llu\nd2h_staging_bytes=%llu\n",
         k->knobs.outstanding, k->knobs.direct_first, k->knobs.staging_threads,
         (unsigned long long)k->h2d_staging_bytes, (unsigned long long)k->d2h_staging_bytes);
  return 0;
}

/* A thread that burns `ms` of its own CPU under `name`, then waits to be released (an ended thread's time
 * drops out of the sum). */
typedef struct {
  const char *name;
  int ms;
  volatile int burnt, release;
} burner;
static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static void *burn(void *arg) {
  burner *b = arg;
  pthread_setname_np(pthread_self(), b->name);
  while (thread_cpu_s() < b->ms / 1e3) {
  }
  b->burnt = 1;
  while (!b->release) nap_ms(5);
  return NULL;
}
/* The CPU of gpudash's threads once the preload has looked for them again (it does at most once a second). */
static uint64_t own_cpu_after_search(void) {
  nap_ms(1100);
  return fresh()->threads_cpu_ns;
}

static int scenario_own_cpu(void) {
  setup();
  fill(page, MB, 30);
  CHECK(cudaMemcpy(dev, page, MB, H2D) == 0); /* starts the engine and its ge-* threads */
  expect(0, 1, MB, 1);
  uint64_t before = own_cpu_after_search();
  CHECK(before > 0);
  burner theirs = {"app-worker", 500, 0, 0}, ours = {"gpudash-burn", 500, 0, 0};
  pthread_t t1, t2;
  CHECK(pthread_create(&t1, NULL, burn, &theirs) == 0);
  while (!theirs.burnt) nap_ms(5);
  uint64_t mid = own_cpu_after_search();
  CHECK(mid - before < 250000000ull); /* the program's own thread is not gpudash's */
  CHECK(pthread_create(&t2, NULL, burn, &ours) == 0);
  while (!ours.burnt) nap_ms(5);
  uint64_t after = own_cpu_after_search();
  CHECK(after - mid >= 500000000ull); /* a gpudash-* thread started after the engine is found */
  theirs.release = ours.release = 1;
  CHECK(pthread_join(t1, NULL) == 0 && pthread_join(t2, NULL) == 0);
  COUNTS();
  return 0;
}

int main(int argc, char **argv) {
  alarm(60);  /* a hang fails the test instead of stalling it */
  if (argc < 2) return 2;
  const char *s = argv[1];
  int rc = !strcmp(s, "doors") ? scenario_doors()
           : !strcmp(s, "engine-fails") ? scenario_engine_fails()
           : !strcmp(s, "hostfunc") ? scenario_hostfunc()
           : !strcmp(s, "off") ? scenario_passthrough(GP_STATE_OFF)
           : !strcmp(s, "failed") ? scenario_passthrough(GP_STATE_FAILED)
           : !strcmp(s, "knobs") ? scenario_knobs()
           : !strcmp(s, "fork") ? scenario_fork()
           : !strcmp(s, "exit") ? scenario_exit()
           : !strcmp(s, "defaults") ? scenario_defaults()
           : !strcmp(s, "early-start") ? scenario_early_start()
           : !strcmp(s, "threads") ? scenario_threads()
           : !strcmp(s, "one-gpu") ? scenario_one_gpu(0)
           : !strcmp(s, "one-gpu-always") ? scenario_one_gpu(1)
           : !strcmp(s, "file-source") ? scenario_file_source()
           : !strcmp(s, "own-cpu") ? scenario_own_cpu()
           : 2;
  if (rc == 0) printf("scenario %s passed\n", s);
  return rc;
}
