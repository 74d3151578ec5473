/* Finding the real functions without going through our own hooks: the table of the intercepted
 * functions, glibc's dlsym by version, the originals of the intercepted functions, the driver functions
 * the preload calls itself, and the address ranges of our own code (whose dlsym lookups must never be
 * answered by the dlsym door). */
#include "preload.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

/* Names and variants of the intercepted functions (doors.c holds a wrapper for each). */
const gp_fn_info gp_fns[GP_NFN] = {
    [GP_FN_CUDA_MEMCPY] = {"cudaMemcpy", NULL, 0, 0, 0, 0},
    [GP_FN_CUDA_MEMCPY_PTDS] = {"cudaMemcpy_ptds", NULL, 0, 1, 0, 0},
    [GP_FN_CUDA_MEMCPY_ASYNC] = {"cudaMemcpyAsync", NULL, 0, 0, 1, 0},
    [GP_FN_CUDA_MEMCPY_ASYNC_PTSZ] = {"cudaMemcpyAsync_ptsz", NULL, 0, 1, 1, 0},
    [GP_FN_CU_HTOD] = {"cuMemcpyHtoD_v2", "cuMemcpyHtoD", 1, 0, 0, 3020},
    [GP_FN_CU_HTOD_PTDS] = {"cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoD", 1, 1, 0, 3020},
    [GP_FN_CU_DTOH] = {"cuMemcpyDtoH_v2", "cuMemcpyDtoH", 1, 0, 0, 3020},
    [GP_FN_CU_DTOH_PTDS] = {"cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoH", 1, 1, 0, 3020},
    [GP_FN_CU_HTOD_ASYNC] = {"cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync", 1, 0, 1, 3020},
    [GP_FN_CU_HTOD_ASYNC_PTSZ] = {"cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyHtoDAsync", 1, 1, 1, 3020},
    [GP_FN_CU_DTOH_ASYNC] = {"cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync", 1, 0, 1, 3020},
    [GP_FN_CU_DTOH_ASYNC_PTSZ] = {"cuMemcpyDtoHAsync_v2_ptsz", "cuMemcpyDtoHAsync", 1, 1, 1, 3020},
    [GP_FN_CU_MEMCPY] = {"cuMemcpy", "cuMemcpy", 1, 0, 0, 4000},
    [GP_FN_CU_MEMCPY_PTDS] = {"cuMemcpy_ptds", "cuMemcpy", 1, 1, 0, 4000},
    [GP_FN_CU_MEMCPY_ASYNC] = {"cuMemcpyAsync", "cuMemcpyAsync", 1, 0, 1, 4000},
    [GP_FN_CU_MEMCPY_ASYNC_PTSZ] = {"cuMemcpyAsync_ptsz", "cuMemcpyAsync", 1, 1, 1, 4000},
    [GP_FN_CU_GPA] = {"cuGetProcAddress", "cuGetProcAddress", 1, 0, 0, 11030},
    [GP_FN_CU_GPA_V2] = {"cuGetProcAddress_v2", "cuGetProcAddress", 1, 0, 0, 12000},
};

_Atomic(void *) gp_real[GP_NFN];
static _Atomic(gp_dlsym_t) real_dlsym;

gp_dlsym_t gp_dlsym_fn(void) {
  gp_dlsym_t f = atomic_load_explicit(&real_dlsym, memory_order_acquire);
  if (GP_LIKELY(f)) return f;
  /* dlvsym is not hooked; RTLD_NEXT from here is the object after this one (glibc). */
  static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
  for (size_t i = 0; i < sizeof versions / sizeof *versions && !f; ++i)
    f = (gp_dlsym_t)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
  atomic_store_explicit(&real_dlsym, f, memory_order_release);
  return f;
}

void *gp_real_dlsym(void *handle, const char *name) { return gp_dlsym_fn()(handle, name); }

/* ---- our own code's address ranges --------------------------------------------------------- */
static struct { _Atomic uintptr_t lo, hi; } own[2];

struct range_query { uintptr_t addr, lo, hi; };

static int find_range(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  struct range_query *q = arg;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = info->dlpi_addr + ph->p_vaddr;
    if (a < lo) lo = a;
    if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
  }
  if (q->addr < lo || q->addr >= hi) return 0;
  q->lo = lo;
  q->hi = hi;
  return 1;
}

void gp_own_add(const void *addr) {
  struct range_query q = {(uintptr_t)addr, 0, 0};
  if (!dl_iterate_phdr(find_range, &q)) return;
  for (int i = 0; i < 2; ++i) {
    if (atomic_load(&own[i].hi)) continue;
    atomic_store(&own[i].lo, q.lo);
    atomic_store(&own[i].hi, q.hi);
    return;
  }
}

int gp_own_address(const void *addr) {
  uintptr_t a = (uintptr_t)addr;
  for (int i = 0; i < 2; ++i)
    if (a >= atomic_load_explicit(&own[i].lo, memory_order_relaxed) &&
        a < atomic_load_explicit(&own[i].hi, memory_order_relaxed))
      return 1;
  return 0;
}

/* ---- originals ---------------------------------------------------------------------------- */
/* Whether p lies in this library (asked once per intercepted function, so before our constructor has
 * noted our address ranges too). */
static int in_this_library(const void *p) {
  Dl_info mine, theirs;
  return dladdr((const void *)in_this_library, &mine) && dladdr(p, &theirs) && mine.dli_fbase == theirs.dli_fbase;
}

static void *resolve(int fn) {
  const gp_fn_info *f = &gp_fns[fn];
  void *p = NULL;
  if (f->driver) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h) {
      p = gp_real_dlsym(h, f->name);
      dlclose(h);
    }
    if (!p) p = gp_real_dlsym(RTLD_NEXT, f->name);
  } else {
    p = dlvsym(RTLD_NEXT, f->name, "libcudart.so.13");
    if (!p) {
      void *h = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
      if (h) {
        p = dlvsym(h, f->name, "libcudart.so.13");
        if (!p) p = gp_real_dlsym(h, f->name);
        dlclose(h);
      }
    }
  }
  return p && in_this_library(p) ? NULL : p;  /* our own wrapper is never the original */
}

void *gp_original(int fn) {
  void *p = atomic_load_explicit(&gp_real[fn], memory_order_acquire);
  if (GP_LIKELY(p)) return p;
  p = resolve(fn);
  void *expected = NULL;
  if (p && !atomic_compare_exchange_strong(&gp_real[fn], &expected, p)) p = expected;
  return p;
}

typedef int (*cudart_sync_t)(void *, const void *, size_t, int);
typedef int (*cudart_async_t)(void *, const void *, size_t, int, CUstream);
typedef CUresult (*htod_t)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*htod_async_t)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*dtoh_async_t)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*memcpy_t)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*memcpy_async_t)(CUdeviceptr, CUdeviceptr, size_t, CUstream);

int gp_call_original(const gp_call *c) {
  void *p = gp_original(c->fn);
  if (!p) return gp_fns[c->fn].driver ? 3 /* CUDA_ERROR_NOT_INITIALIZED */ : 35 /* cudaErrorInsufficientDriver */;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)c->dst, s = (CUdeviceptr)(uintptr_t)c->src;
  int rc;
  ++gp_nested;
  switch (c->fn) {
    case GP_FN_CUDA_MEMCPY:
    case GP_FN_CUDA_MEMCPY_PTDS: rc = ((cudart_sync_t)p)(c->dst, c->src, c->n, c->kind); break;
    case GP_FN_CUDA_MEMCPY_ASYNC:
    case GP_FN_CUDA_MEMCPY_ASYNC_PTSZ: rc = ((cudart_async_t)p)(c->dst, c->src, c->n, c->kind, c->stream); break;
    case GP_FN_CU_HTOD:
    case GP_FN_CU_HTOD_PTDS: rc = ((htod_t)p)(d, c->src, c->n); break;
    case GP_FN_CU_DTOH:
    case GP_FN_CU_DTOH_PTDS: rc = ((dtoh_t)p)(c->dst, s, c->n); break;
    case GP_FN_CU_HTOD_ASYNC:
    case GP_FN_CU_HTOD_ASYNC_PTSZ: rc = ((htod_async_t)p)(d, c->src, c->n, c->stream); break;
    case GP_FN_CU_DTOH_ASYNC:
    case GP_FN_CU_DTOH_ASYNC_PTSZ: rc = ((dtoh_async_t)p)(c->dst, s, c->n, c->stream); break;
    case GP_FN_CU_MEMCPY:
    case GP_FN_CU_MEMCPY_PTDS: rc = ((memcpy_t)p)(d, s, c->n); break;
    default: rc = ((memcpy_async_t)p)(d, s, c->n, c->stream); break;
  }
  --gp_nested;
  return rc;
}

/* ---- the driver functions the preload calls itself ------------------------------------------ */
int gp_load_driver(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return -1;
  typedef CUresult (*gpa_t)(const char *, void **, int, uint64_t, int *);
  gpa_t gpa = (gpa_t)gp_real_dlsym(h, "cuGetProcAddress_v2");
  if (!gpa) return -1;
  struct { const char *name; void **slot; } want[] = {
      {"cuStreamIsCapturing", (void **)&gp.cu.cuStreamIsCapturing},
      {"cuStreamGetCtx", (void **)&gp.cu.cuStreamGetCtx},
      {"cuEventCreate", (void **)&gp.cu.cuEventCreate},
      {"cuEventDestroy", (void **)&gp.cu.cuEventDestroy},
      {"cuEventRecord", (void **)&gp.cu.cuEventRecord},
      {"cuEventQuery", (void **)&gp.cu.cuEventQuery},
      {"cuEventSynchronize", (void **)&gp.cu.cuEventSynchronize},
      {"cuStreamWaitValue32", (void **)&gp.cu.cuStreamWaitValue32},
      {"cuLaunchHostFunc", (void **)&gp.cu.cuLaunchHostFunc},
      {"cuCtxPushCurrent", (void **)&gp.cu.cuCtxPushCurrent},
      {"cuCtxPopCurrent", (void **)&gp.cu.cuCtxPopCurrent},
      {"cuMemHostAlloc", (void **)&gp.cu.cuMemHostAlloc},
      {"cuMemHostGetDevicePointer", (void **)&gp.cu.cuMemHostGetDevicePointer},
      {"cuStreamCreate", (void **)&gp.cu.cuStreamCreate},
      {"cuStreamSynchronize", (void **)&gp.cu.cuStreamSynchronize},
      {"cuMemcpyAsync", (void **)&gp.cu.cuMemcpyAsync},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; ++i) {
    int status = 0;
    *want[i].slot = NULL;
    /* legacy-stream variants: the special stream handles say which default stream is meant */
    if (gpa(want[i].name, want[i].slot, 12000, 1 /* LEGACY_STREAM */, &status) != 0 || !*want[i].slot) return -1;
  }
  return 0;
}
