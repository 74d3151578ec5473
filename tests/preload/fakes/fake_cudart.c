/* A fake libcudart.so.13 for the preload's CI tests. Like the real one it reaches the driver only
 * through dlopen("libcuda.so.1") + dlsym(handle, "cuGetProcAddress_v2") + cuGetProcAddress, so under the
 * preload its own driver calls go through the preload's driver door (nested, and not to be counted
 * twice). Its symbols carry the version libcudart.so.13, as the real library's do. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

#define API __attribute__((visibility("default")))
typedef int cudaError_t;
typedef void *cudaStream_t;
typedef unsigned long long CUdeviceptr;

static struct {
  int (*init)(unsigned);
  int (*retain)(void **, int);
  int (*get_current)(void **);
  int (*set_current)(void *);
  int (*memcpy_[2])(CUdeviceptr, CUdeviceptr, size_t);
  int (*memcpy_async[2])(CUdeviceptr, CUdeviceptr, size_t, void *);
  int (*mem_alloc)(CUdeviceptr *, size_t);
  int (*mem_free)(CUdeviceptr);
  int (*host_alloc)(void **, size_t, unsigned);
  int (*free_host)(void *);
  int (*stream_create)(void **, unsigned);
  int (*stream_sync)(void *);
  int (*begin_capture)(void *, int);
  int (*end_capture)(void *, void **);
  int (*is_capturing)(void *, int *);
} drv;
static int loaded;
static __thread int device;

static int load(void) {
  if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE)) return 0;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return 35;
  int (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(h, "cuGetProcAddress_v2");
  if (!gpa) return 35;
  struct { const char *name; void **slot; unsigned long long flags; } want[] = {
      {"cuInit", (void **)&drv.init, 0}, {"cuDevicePrimaryCtxRetain", (void **)&drv.retain, 0},
      {"cuCtxGetCurrent", (void **)&drv.get_current, 0}, {"cuCtxSetCurrent", (void **)&drv.set_current, 0},
      {"cuMemcpy", (void **)&drv.memcpy_[0], 1}, {"cuMemcpy", (void **)&drv.memcpy_[1], 2},
      {"cuMemcpyAsync", (void **)&drv.memcpy_async[0], 1}, {"cuMemcpyAsync", (void **)&drv.memcpy_async[1], 2},
      {"cuMemAlloc", (void **)&drv.mem_alloc, 0}, {"cuMemFree", (void **)&drv.mem_free, 0},
      {"cuMemHostAlloc", (void **)&drv.host_alloc, 0}, {"cuMemFreeHost", (void **)&drv.free_host, 0},
      {"cuStreamCreate", (void **)&drv.stream_create, 0}, {"cuStreamSynchronize", (void **)&drv.stream_sync, 0},
      {"cuStreamBeginCapture", (void **)&drv.begin_capture, 0}, {"cuStreamEndCapture", (void **)&drv.end_capture, 0},
      {"cuStreamIsCapturing", (void **)&drv.is_capturing, 0},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; ++i) {
    int st = 0;
    if (gpa(want[i].name, want[i].slot, 13000, want[i].flags, &st) || !*want[i].slot) return 35;
  }
  drv.init(0);
  __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
  return 0;
}

/* cudart makes the current device's primary context current before each call */
static int enter(void) {
  int rc = load();
  if (rc) return rc;
  void *c = NULL;
  drv.get_current(&c);
  if (!c) {
    drv.retain(&c, device);
    drv.set_current(c);
  }
  return 0;
}

static int memcpy_checked(int ptd, void *dst, const void *src, size_t n, int kind) {
  if (kind < 0 || kind > 4) return 21; /* cudaErrorInvalidMemcpyDirection */
  int rc = enter();
  return rc ? rc : drv.memcpy_[ptd]((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n);
}
static int memcpy_async_checked(int ptd, void *dst, const void *src, size_t n, int kind, cudaStream_t s) {
  if (kind < 0 || kind > 4) return 21;
  int rc = enter();
  return rc ? rc : drv.memcpy_async[ptd]((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, s);
}

API cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int k) { return memcpy_checked(0, d, s, n, k); }
API cudaError_t cudaMemcpy_ptds(void *d, const void *s, size_t n, int k) { return memcpy_checked(1, d, s, n, k); }
API cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int k, cudaStream_t st) {
  return memcpy_async_checked(0, d, s, n, k, st);
}
API cudaError_t cudaMemcpyAsync_ptsz(void *d, const void *s, size_t n, int k, cudaStream_t st) {
  return memcpy_async_checked(1, d, s, n, k, st);
}
API cudaError_t cudaSetDevice(int d) {
  int rc = load();
  if (rc) return rc;
  void *c = NULL;
  device = d;
  drv.retain(&c, d);
  return drv.set_current(c);
}
API cudaError_t cudaMalloc(void **p, size_t n) {
  int rc = enter();
  CUdeviceptr d = 0;
  if (!rc) rc = drv.mem_alloc(&d, n);
  *p = (void *)(uintptr_t)d;
  return rc;
}
API cudaError_t cudaFree(void *p) { int rc = enter(); return rc ? rc : drv.mem_free((CUdeviceptr)(uintptr_t)p); }
API cudaError_t cudaMallocHost(void **p, size_t n) { int rc = enter(); return rc ? rc : drv.host_alloc(p, n, 0); }
API cudaError_t cudaFreeHost(void *p) { int rc = enter(); return rc ? rc : drv.free_host(p); }
API cudaError_t cudaStreamCreate(cudaStream_t *s) { int rc = enter(); return rc ? rc : drv.stream_create(s, 0); }
API cudaError_t cudaStreamSynchronize(cudaStream_t s) { int rc = enter(); return rc ? rc : drv.stream_sync(s ? s : (void *)1); }
API cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode) { int rc = enter(); return rc ? rc : drv.begin_capture(s, mode); }
API cudaError_t cudaStreamEndCapture(cudaStream_t s, void **g) { int rc = enter(); return rc ? rc : drv.end_capture(s, g); }
API cudaError_t cudaStreamIsCapturing(cudaStream_t s, int *st) { int rc = enter(); return rc ? rc : drv.is_capturing(s, st); }
