/* A counting LD_PRELOAD for the baseline of benchmarks/bench_preload_llama.py: it changes nothing, only
 * measures the wall time a program spends inside cudart's copy calls (cudaMemcpy, cudaMemcpyAsync and
 * their per-thread-default-stream variants), per direction, and keeps the totals in the shared-memory
 * segment /gpudash-copy-counter-<pid> (three cc_dir records: H2D, D2H, other kinds) for the benchmark
 * to read between requests. Build: cc -O2 -shared -fPIC -o libcopy_counter.so copy_counter.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  uint64_t calls, bytes, ns;
} cc_dir;

static cc_dir *dirs; /* [0] H2D, [1] D2H, [2] any other kind */

__attribute__((constructor)) static void start(void) {
  char name[64];
  snprintf(name, sizeof name, "/gpudash-copy-counter-%d", (int)getpid());
  int fd = shm_open(name, O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, 3 * sizeof(cc_dir)) != 0) return;
  void *p = mmap(NULL, 3 * sizeof(cc_dir), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  dirs = p == MAP_FAILED ? NULL : p;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void count(int kind, size_t n, uint64_t ns) {
  if (!dirs) return;
  cc_dir *d = &dirs[kind == 1 ? 0 : kind == 2 ? 1 : 2]; /* cudaMemcpyHostToDevice = 1, DeviceToHost = 2 */
  __atomic_add_fetch(&d->calls, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&d->bytes, n, __ATOMIC_RELAXED);
  __atomic_add_fetch(&d->ns, ns, __ATOMIC_RELAXED);
}

#define SYNC_COPY(NAME)                                                            \
  int NAME(void *dst, const void *src, size_t n, int kind) {                       \
    static int (*real)(void *, const void *, size_t, int);                         \
    if (!real) real = (int (*)(void *, const void *, size_t, int))dlsym(RTLD_NEXT, #NAME); \
    uint64_t t0 = now_ns();                                                        \
    int rc = real(dst, src, n, kind);                                              \
    count(kind, n, now_ns() - t0);                                                 \
    return rc;                                                                     \
  }
#define ASYNC_COPY(NAME)                                                           \
  int NAME(void *dst, const void *src, size_t n, int kind, void *stream) {         \
    static int (*real)(void *, const void *, size_t, int, void *);                 \
    if (!real) real = (int (*)(void *, const void *, size_t, int, void *))dlsym(RTLD_NEXT, #NAME); \
    uint64_t t0 = now_ns();                                                        \
    int rc = real(dst, src, n, kind, stream);                                      \
    count(kind, n, now_ns() - t0);                                                 \
    return rc;                                                                     \
  }

SYNC_COPY(cudaMemcpy)
SYNC_COPY(cudaMemcpy_ptds)
ASYNC_COPY(cudaMemcpyAsync)
ASYNC_COPY(cudaMemcpyAsync_ptsz)

__attribute__((destructor)) static void stop(void) {
  char name[64];
  snprintf(name, sizeof name, "/gpudash-copy-counter-%d", (int)getpid());
  shm_unlink(name);
}
