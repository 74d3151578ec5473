/* Cost of one call that the preload passes through, per door: small (4 KiB) copies and a device-to-
 * device copy, against the fake CUDA libraries with FAKECUDA_NULL_COPIES=1 (copies do nothing, so the
 * time is the call chain). Prints "<door> <ns per call>" lines: the best of 5 rounds of 200k calls.
 * benchmarks/bench_preload_passthrough.py runs it with and without the preload and prints the table. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef unsigned long long CUdeviceptr;
int cudaMemcpy(void *, const void *, size_t, int);
int cudaMemcpyAsync(void *, const void *, size_t, int, void *);
int cudaMalloc(void **, size_t);
int cudaStreamCreate(void **);
int cudaSetDevice(int);

#define CALLS 200000
#define ROUNDS 5

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *dev, *dev2, *host, *stream;
static int (*dl_memcpy)(void *, const void *, size_t, int);
static int (*htod_async)(CUdeviceptr, const void *, size_t, void *);

static int call(int which) {
  switch (which) {
    case 0: return cudaMemcpyAsync(dev, host, 4096, 1, stream);
    case 1: return cudaMemcpy(dev, host, 4096, 1);
    case 2: return cudaMemcpyAsync(dev, dev2, 4096, 3, stream);
    case 3: return dl_memcpy(dev, host, 4096, 1);
    default: return htod_async((CUdeviceptr)(uintptr_t)dev, host, 4096, stream);
  }
}

int main(void) {
  static const char *names[] = {"cudaMemcpyAsync 4KiB H2D (PLT)", "cudaMemcpy 4KiB H2D (PLT)",
                                "cudaMemcpyAsync 4KiB D2D (PLT)", "cudaMemcpy 4KiB H2D (dlsym)",
                                "cuMemcpyHtoDAsync 4KiB (cuGetProcAddress)"};
  if (cudaSetDevice(0) || cudaMalloc(&dev, 1 << 20) || cudaMalloc(&dev2, 1 << 20) || cudaStreamCreate(&stream))
    return 1;
  host = malloc(1 << 20);
  void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD), *hc = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h || !hc) return 1;
  dl_memcpy = (int (*)(void *, const void *, size_t, int))dlsym(h, "cudaMemcpy");
  int (*gpa)(const char *, void **, int, unsigned long long, int *) =
      (int (*)(const char *, void **, int, unsigned long long, int *))dlsym(hc, "cuGetProcAddress_v2");
  int st = 0;
  if (!dl_memcpy || !gpa || gpa("cuMemcpyHtoDAsync", (void **)&htod_async, 13000, 0, &st) || !htod_async) return 1;
  for (int w = 0; w < 5; ++w) {
    double best = 1e9;
    for (int r = 0; r < ROUNDS; ++r) {
      double t0 = now();
      for (int i = 0; i < CALLS; ++i)
        if (call(w)) return 1;
      double ns = (now() - t0) / CALLS * 1e9;
      if (ns < best) best = ns;
    }
    printf("%s\t%.1f\n", names[w], best);
  }
  return 0;
}
