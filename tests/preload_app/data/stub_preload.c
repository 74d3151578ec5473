/* A stand-in for libgpudash_preload.so with none of its copy handling: loaded through LD_PRELOAD it
 * publishes the stats block a preloaded process publishes (built on gpudash_preload_shm.h alone), with
 * the name from GPUDASH_PRELOAD_NAME and the start-up knobs parsed from GPUDASH_PRELOAD_KNOBS, and
 * removes both blocks at exit. It lets CI check the environment `gpudash run` and the supervisor give
 * a process, and what telemetry reads back, without a GPU. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gpudash_preload_shm.h"

static char stats_name[96], knobs_name[96];
static pid_t owner;

static void *make(const char *fmt, char *name, size_t size) {
  snprintf(name, 96, fmt, (int)getpid());
  int fd = shm_open(name, O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return NULL;
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? NULL : p;
}

static void knob(gp_stats_block *s, const char *k, unsigned long long v) {
  if (!strcmp(k, "h2d_chunk_bytes")) s->knobs.h2d_chunk_bytes = v;
  else if (!strcmp(k, "d2h_chunk_bytes")) s->knobs.d2h_chunk_bytes = v;
  else if (!strcmp(k, "h2d_fallback_bytes")) s->knobs.h2d_fallback_bytes = v;
  else if (!strcmp(k, "d2h_fallback_bytes")) s->knobs.d2h_fallback_bytes = v;
  else if (!strcmp(k, "outstanding")) s->knobs.outstanding = (int32_t)v;
  else if (!strcmp(k, "direct_first")) s->knobs.direct_first = (int32_t)v;
  else if (!strcmp(k, "staging_threads")) s->knobs.staging_threads = (int32_t)v;
  else if (!strcmp(k, "h2d_staging_bytes")) s->h2d_staging_bytes = v;
  else if (!strcmp(k, "d2h_staging_bytes")) s->d2h_staging_bytes = v;
}

__attribute__((constructor)) static void start(void) {
  const char *sw = getenv("GPUDASH_PRELOAD");
  gp_stats_block *s = make(GPUDASH_PRELOAD_STATS_FMT, stats_name, sizeof *s);
  gp_knobs_block *k = make(GPUDASH_PRELOAD_KNOBS_FMT, knobs_name, sizeof *k);
  if (!s || !k) return;
  owner = getpid();
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  ge_knobs k0 = {2810000, 5370000, 11300000, 13000000, 2, 1, 4, 0};
  s->knobs = k0;
  s->h2d_staging_bytes = 16u << 20;
  s->d2h_staging_bytes = 4u << 20;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", getenv("GPUDASH_PRELOAD_KNOBS") ? getenv("GPUDASH_PRELOAD_KNOBS") : "");
  for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    if (eq) { *eq = 0; knob(s, kv, strtoull(eq + 1, NULL, 10)); }
  }
  k->magic = GPUDASH_PRELOAD_MAGIC;
  k->version = GPUDASH_PRELOAD_SHM_VERSION;
  k->enabled = 1;
  s->pid = (int32_t)owner;
  s->state = sw && !strcmp(sw, "off") ? GP_STATE_OFF : GP_STATE_ACTIVE;
  s->num_gpus = 1;
  s->num_paths = 2; /* direct:0 both ways, idle */
  s->paths[0].direction = GE_H2D;
  s->paths[1].direction = GE_D2H;
  s->started_at = s->updated_at = (double)t.tv_sec + t.tv_nsec * 1e-9;
  snprintf(s->name, sizeof s->name, "%s", getenv("GPUDASH_PRELOAD_NAME") ? getenv("GPUDASH_PRELOAD_NAME") : "");
  s->version = GPUDASH_PRELOAD_SHM_VERSION;
  __atomic_store_n(&s->magic, GPUDASH_PRELOAD_MAGIC, __ATOMIC_RELEASE);
}

__attribute__((destructor)) static void stop(void) {
  if (owner && owner == getpid()) {
    shm_unlink(stats_name);
    shm_unlink(knobs_name);
  }
}
