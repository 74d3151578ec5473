/* A CUDA program for the hostile preload tests, linked against the fake libcudart (tests/preload/fakes):
 * one pinned 1 MiB host-to-device copy, which makes libgpudash_preload.so create its blocks, then
 *   quick      exit at once (a program shorter than gpudash run's first look at its blocks);
 *   truncate   cut both of its own blocks to 0 bytes (as any process of this user could), wait while the
 *              publisher writes to them again and again, copy again, and exit normally.
 * Prints its pid first. Exit 0 when every copy succeeded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cudaMemcpy(void *, const void *, size_t, int);
int cudaMalloc(void **, size_t);
int cudaMallocHost(void **, size_t);

#define MB (1u << 20)

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
  const char *how = argc > 1 ? argv[1] : "quick";
  printf("%d\n", (int)getpid());
  fflush(stdout);
  void *dev = NULL, *host = NULL;
  if (cudaMalloc(&dev, MB) || cudaMallocHost(&host, MB)) return 10;
  memset(host, 7, MB);
  if (cudaMemcpy(dev, host, MB, 1)) return 11;
  if (!strcmp(how, "truncate")) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/gpudash-preload-stats-%d", (int)getpid());
    if (truncate(path, 0)) return 12;
    snprintf(path, sizeof path, "/dev/shm/gpudash-preload-knobs-%d", (int)getpid());
    if (truncate(path, 0)) return 13;
    nap_ms(300);
    if (cudaMemcpy(dev, host, MB, 1)) return 14;
    nap_ms(50);
  }
  return 0;
}
