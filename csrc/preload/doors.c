/* The three doors: PLT calls into libcudart.so.13 (these exported wrappers, versioned like cudart's own
 * symbols by preload.map), dlsym lookups on a cudart or libcuda handle (the dlsym below), and the
 * driver table handed out by cuGetProcAddress. Each wrapper either hands its call to carry.c or passes it
 * to the original with two relaxed counter updates and no lock or system call. */
#include "preload.h"

#include <dlfcn.h>
#include <string.h>

/* A passed call: counted (when its direction is known) and forwarded. */
static int pass(const gp_call *c, int dir) {
  gp_add(dir, GP_C_PASSED, 1);
  gp_add(dir, GP_C_BYTES_PASSED, c->n);
  int rc = gp_call_original(c);
  if (GP_UNLIKELY(rc)) gp_add(dir, GP_C_ERRORS, 1);
  return rc;
}

static inline int known_dir(int kind) { return kind == GP_KIND_H2D ? GE_H2D : kind == GP_KIND_D2H ? GE_D2H : -1; }

/* Whether a copy may be worth taking: a host<->device kind, at least the smallest size any policy takes. */
static inline int candidate(int kind, size_t n) {
  if (n == 0) return 0;
  if (kind == GP_KIND_H2D) return n >= atomic_load_explicit(&gp.quick_min[GE_H2D], memory_order_relaxed);
  if (kind == GP_KIND_D2H) return n >= atomic_load_explicit(&gp.quick_min[GE_D2H], memory_order_relaxed);
  if (kind == GP_KIND_DEFAULT)
    return n >= atomic_load_explicit(&gp.quick_min[GE_H2D], memory_order_relaxed) ||
           n >= atomic_load_explicit(&gp.quick_min[GE_D2H], memory_order_relaxed);
  return 0;
}

static int door(gp_call *c) {
  if (GP_UNLIKELY(gp_nested)) return gp_call_original(c);  /* cudart calling the driver for us */
  int worth = candidate(c->kind, c->n);
  if (GP_UNLIKELY(atomic_load_explicit(&gp.setup, memory_order_acquire) != 2)) gp_first_entry(worth);
  int dir = known_dir(c->kind), why = -1;
  if (worth && c->dst && c->src && atomic_load_explicit(&gp.state, memory_order_relaxed) == GP_STATE_ACTIVE &&
      atomic_load_explicit(&gp.enabled, memory_order_relaxed)) {
    int rc = 0, taken = gp_take(c, &rc, &dir, &why);
    if (GP_UNLIKELY(gp_tracing)) gp_trace(c, why);
    if (taken) return rc;
    gp_add(dir, GP_C_WHY + why, 1);
  } else if (worth && GP_UNLIKELY(gp_tracing)) {
    gp_trace(c, why);
  }
  return pass(c, dir);
}

/* ---- cudart (PLT and dlsym) ---------------------------------------------------------------- */
#define CUDART_SYNC(sym, id)                                                          \
  GP_API int sym(void *dst, const void *src, size_t n, int kind) {                    \
    gp_call c = {id, dst, src, n, kind, 0};                                           \
    return door(&c);                                                                  \
  }
#define CUDART_ASYNC(sym, id)                                                         \
  GP_API int sym(void *dst, const void *src, size_t n, int kind, CUstream s) {        \
    gp_call c = {id, dst, src, n, kind, s};                                           \
    return door(&c);                                                                  \
  }
CUDART_SYNC(cudaMemcpy, GP_FN_CUDA_MEMCPY)
CUDART_SYNC(cudaMemcpy_ptds, GP_FN_CUDA_MEMCPY_PTDS)
CUDART_ASYNC(cudaMemcpyAsync, GP_FN_CUDA_MEMCPY_ASYNC)
CUDART_ASYNC(cudaMemcpyAsync_ptsz, GP_FN_CUDA_MEMCPY_ASYNC_PTSZ)

/* ---- driver (handed out by cuGetProcAddress and dlsym on libcuda; not exported) -------------- */
#define CU_HTOD(sym, id)                                                              \
  static CUresult sym(CUdeviceptr dst, const void *src, size_t n) {                   \
    gp_call c = {id, (void *)(uintptr_t)dst, src, n, GP_KIND_H2D, 0};                 \
    return door(&c);                                                                  \
  }
#define CU_DTOH(sym, id)                                                              \
  static CUresult sym(void *dst, CUdeviceptr src, size_t n) {                         \
    gp_call c = {id, dst, (const void *)(uintptr_t)src, n, GP_KIND_D2H, 0};           \
    return door(&c);                                                                  \
  }
#define CU_HTOD_ASYNC(sym, id)                                                        \
  static CUresult sym(CUdeviceptr dst, const void *src, size_t n, CUstream s) {       \
    gp_call c = {id, (void *)(uintptr_t)dst, src, n, GP_KIND_H2D, s};                 \
    return door(&c);                                                                  \
  }
#define CU_DTOH_ASYNC(sym, id)                                                        \
  static CUresult sym(void *dst, CUdeviceptr src, size_t n, CUstream s) {             \
    gp_call c = {id, dst, (const void *)(uintptr_t)src, n, GP_KIND_D2H, s};           \
    return door(&c);                                                                  \
  }
#define CU_MEMCPY(sym, id)                                                            \
  static CUresult sym(CUdeviceptr dst, CUdeviceptr src, size_t n) {                   \
    gp_call c = {id, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, GP_KIND_DEFAULT, 0}; \
    return door(&c);                                                                  \
  }
#define CU_MEMCPY_ASYNC(sym, id)                                                      \
  static CUresult sym(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {       \
    gp_call c = {id, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, GP_KIND_DEFAULT, s}; \
    return door(&c);                                                                  \
  }
CU_HTOD(w_cuMemcpyHtoD_v2, GP_FN_CU_HTOD)
CU_HTOD(w_cuMemcpyHtoD_v2_ptds, GP_FN_CU_HTOD_PTDS)
CU_DTOH(w_cuMemcpyDtoH_v2, GP_FN_CU_DTOH)
CU_DTOH(w_cuMemcpyDtoH_v2_ptds, GP_FN_CU_DTOH_PTDS)
CU_HTOD_ASYNC(w_cuMemcpyHtoDAsync_v2, GP_FN_CU_HTOD_ASYNC)
CU_HTOD_ASYNC(w_cuMemcpyHtoDAsync_v2_ptsz, GP_FN_CU_HTOD_ASYNC_PTSZ)
CU_DTOH_ASYNC(w_cuMemcpyDtoHAsync_v2, GP_FN_CU_DTOH_ASYNC)
CU_DTOH_ASYNC(w_cuMemcpyDtoHAsync_v2_ptsz, GP_FN_CU_DTOH_ASYNC_PTSZ)
CU_MEMCPY(w_cuMemcpy, GP_FN_CU_MEMCPY)
CU_MEMCPY(w_cuMemcpy_ptds, GP_FN_CU_MEMCPY_PTDS)
CU_MEMCPY_ASYNC(w_cuMemcpyAsync, GP_FN_CU_MEMCPY_ASYNC)
CU_MEMCPY_ASYNC(w_cuMemcpyAsync_ptsz, GP_FN_CU_MEMCPY_ASYNC_PTSZ)

GP_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags);
GP_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status);

/* Our wrapper for each intercepted function (real.c's gp_fns tells them apart). */
static void *const wrappers[GP_NFN] = {
    [GP_FN_CUDA_MEMCPY] = (void *)cudaMemcpy,
    [GP_FN_CUDA_MEMCPY_PTDS] = (void *)cudaMemcpy_ptds,
    [GP_FN_CUDA_MEMCPY_ASYNC] = (void *)cudaMemcpyAsync,
    [GP_FN_CUDA_MEMCPY_ASYNC_PTSZ] = (void *)cudaMemcpyAsync_ptsz,
    [GP_FN_CU_HTOD] = (void *)w_cuMemcpyHtoD_v2,
    [GP_FN_CU_HTOD_PTDS] = (void *)w_cuMemcpyHtoD_v2_ptds,
    [GP_FN_CU_DTOH] = (void *)w_cuMemcpyDtoH_v2,
    [GP_FN_CU_DTOH_PTDS] = (void *)w_cuMemcpyDtoH_v2_ptds,
    [GP_FN_CU_HTOD_ASYNC] = (void *)w_cuMemcpyHtoDAsync_v2,
    [GP_FN_CU_HTOD_ASYNC_PTSZ] = (void *)w_cuMemcpyHtoDAsync_v2_ptsz,
    [GP_FN_CU_DTOH_ASYNC] = (void *)w_cuMemcpyDtoHAsync_v2,
    [GP_FN_CU_DTOH_ASYNC_PTSZ] = (void *)w_cuMemcpyDtoHAsync_v2_ptsz,
    [GP_FN_CU_MEMCPY] = (void *)w_cuMemcpy,
    [GP_FN_CU_MEMCPY_PTDS] = (void *)w_cuMemcpy_ptds,
    [GP_FN_CU_MEMCPY_ASYNC] = (void *)w_cuMemcpyAsync,
    [GP_FN_CU_MEMCPY_ASYNC_PTSZ] = (void *)w_cuMemcpyAsync_ptsz,
    [GP_FN_CU_GPA] = (void *)cuGetProcAddress,
    [GP_FN_CU_GPA_V2] = (void *)cuGetProcAddress_v2,
};

/* Hands out our wrapper for `real` when it is the original our wrapper `fn` forwards to (recording it
 * on first sight); any other function, or a second library's copy of it, is returned untouched. */
static void *swap(int fn, void *real) {
  void *expected = NULL;
  if (atomic_compare_exchange_strong(&gp_real[fn], &expected, real) || expected == real) return wrappers[fn];
  return real;
}

/* cuGetProcAddress: the variant the driver returns for (symbol, version, flags); the _v2 copy names
 * exist from CUDA 3.2, per-thread variants are asked for with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. */
static void *swap_driver_entry(const char *symbol, void *real, int version, uint64_t flags) {
  if (!real || symbol[0] != 'c' || symbol[1] != 'u') return real;
  int per_thread = (flags & 2) != 0;
  int best = -1;
  for (int i = 0; i < GP_NFN; ++i) {
    const gp_fn_info *f = &gp_fns[i];
    if (!f->driver || strcmp(f->base, symbol) != 0 || version < f->min_version) continue;
    if (i == GP_FN_CU_GPA || i == GP_FN_CU_GPA_V2) {
      if (best < 0 || f->min_version > gp_fns[best].min_version) best = i;  /* the newest the version allows */
    } else if (f->per_thread == per_thread) {
      best = i;
    }
  }
  return best < 0 ? real : swap(best, real);
}

GP_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
  CUresult (*real)(const char *, void **, int, uint64_t) = gp_original(GP_FN_CU_GPA);
  if (!real) return 500; /* CUDA_ERROR_NOT_FOUND */
  CUresult r = real(symbol, pfn, version, flags);
  if (r == 0 && symbol && pfn) *pfn = swap_driver_entry(symbol, *pfn, version, flags);
  return r;
}

GP_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
  CUresult (*real)(const char *, void **, int, uint64_t, int *) = gp_original(GP_FN_CU_GPA_V2);
  if (!real) return 500;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == 0 && symbol && pfn) *pfn = swap_driver_entry(symbol, *pfn, version, flags);
  return r;
}

/* dlsym on a library handle: our wrapper for the intercepted names, when the handle's symbol is the
 * original we forward to. Lookups by our own code and by any copy of the engine library (the one we
 * opened, or one a Python program in this process loaded with ctypes) go straight to the real dlsym. */
static __attribute__((noinline)) void *dlsym_door(void *handle, const char *name, const void *caller) {
  void *real = gp_real_dlsym(handle, name);
  if (!real) return NULL;
  Dl_info info;
  if (dladdr(caller, &info) && info.dli_fname) {
    const char *base = strrchr(info.dli_fname, '/');
    if (!strcmp(base ? base + 1 : info.dli_fname, "libgpudash_engine.so")) return real;
  }
  for (int i = 0; i < GP_NFN; ++i)
    if (strcmp(gp_fns[i].name, name) == 0) return swap(i, real);
  return real;
}

/* Special handles (RTLD_DEFAULT, RTLD_NEXT) go to the real dlsym in a tail call, so that it still sees
 * the caller's return address (RTLD_NEXT is relative to the calling object). */
GP_API void *dlsym(void *handle, const char *name) {
  if (handle != RTLD_DEFAULT && handle != RTLD_NEXT && name[0] == 'c' && name[1] == 'u' &&
      !gp_own_address(__builtin_return_address(0)))
    return dlsym_door(handle, name, __builtin_return_address(0));
  return gp_dlsym_fn()(handle, name);
}
