/* The start-up knobs (GPUDASH_PRELOAD_KNOBS or defaults), the policy thresholds the doors read, and the
 * two shared-memory blocks of gpudash_preload_shm.h: stats published under a sequence lock, knobs
 * polled and applied when their generation changes. */
#include "preload.h"

#include "knob_limits.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* Staging threads when the knob table leaves it to the machine: half the cores this process may run on. */
static int default_staging_threads(void) {
  cpu_set_t set;
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 4;
  n /= 2;
  return n < 1 ? 1 : n > 16 ? 16 : n;
}

/* Every name the start-up string may hold, for the refusal of an unknown one. */
#define GP_NATIVE_NAME(f, t, off, lo, hi) #f ", "
#define GP_STAGING_NAME(f, d, v, lo, hi) #f ", "
static const char knob_names[] = GE_KNOB_TABLE(GP_NATIVE_NAME) GE_STAGING_KNOBS(GP_STAGING_NAME);

static int outside(uint64_t v, uint64_t lo, uint64_t hi) { return v < lo || v > hi; }

/* Sets one knob by name; 0 when the name is no knob. Names, types and defaults come from csrc/knob_limits.h,
 * generated from gpudash/engine/config.py's knob table (ranges are the engine's to check, at ge_create). */
static int set_knob(ge_knobs *k, uint64_t staging[2], const char *name, unsigned long long v) {
#define GP_SET_NATIVE(f, t, off, lo, hi) if (!strcmp(name, #f)) { k->f = (t)v; return 1; }
#define GP_SET_STAGING(f, d, dflt, lo, hi) if (!strcmp(name, #f)) { staging[d] = v; return 1; }
  GE_KNOB_TABLE(GP_SET_NATIVE)
  GE_STAGING_KNOBS(GP_SET_STAGING)
  return 0;
}

int gp_startup_knobs(ge_knobs *k, uint64_t staging[2], char *err, size_t errlen) {
  memset(k, 0, sizeof *k);
#define GP_DEFAULT(f, v) k->f = v;
#define GP_STAGING_DEFAULT(f, d, v, lo, hi) staging[d] = v;
  GE_KNOB_DEFAULTS(GP_DEFAULT)
  GE_STAGING_KNOBS(GP_STAGING_DEFAULT)
  if (k->staging_threads == 0) k->staging_threads = default_staging_threads();
  const char *env = getenv("GPUDASH_PRELOAD_KNOBS");
  if (!env || !*env) return 0;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", env);
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '=');
    char *end = NULL;
    unsigned long long v = eq ? strtoull(eq + 1, &end, 10) : 0;
    if (!eq || end == eq + 1 || *end) {
      snprintf(err, errlen, "GPUDASH_PRELOAD_KNOBS item '%s' is not name=integer; fix or unset it", item);
      return -1;
    }
    *eq = 0;
    if (!set_knob(k, staging, item, v)) {
      snprintf(err, errlen, "GPUDASH_PRELOAD_KNOBS names an unknown knob '%s' (knobs: %.*s); fix or unset it",
               item, (int)sizeof knob_names - 3, knob_names);
      return -1;
    }
  }
  return 0;
}

static ge_knobs in_force;
static uint64_t in_force_staging[2];
static uint64_t applied_generation;

void gp_apply_policy(const ge_knobs *k, const uint64_t staging[2], int running) {
  in_force = *k;
  in_force_staging[0] = staging[0];
  in_force_staging[1] = staging[1];
  uint64_t fallback[2] = {k->h2d_fallback_bytes, k->d2h_fallback_bytes};
  for (int d = 0; d < 2; ++d) {
    int pinned = !running || atomic_load(&gp.pinned_always);
    for (int g = 0; g < GPUDASH_PRELOAD_MAX_GPUS && !pinned; ++g) pinned = gp.multipath[g][d];
    uint64_t q = staging[d];
    if (pinned && fallback[d] < q) q = fallback[d];
    atomic_store(&gp.pinned_takes[d], pinned);
    atomic_store(&gp.staging_bytes[d], staging[d]);
    atomic_store(&gp.fallback_bytes[d], fallback[d]);
    atomic_store(&gp.quick_min[d], q);
  }
}

/* ---- the blocks --------------------------------------------------------------------------- */
static gp_stats_block *stats;
static gp_knobs_block *knobs;
static char stats_name[64], knobs_name[64];
static double started_at;
static pthread_mutex_t shm_m = PTHREAD_MUTEX_INITIALIZER;  /* the publisher vs exit() */
static void publish_locked(void);

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *map_block(const char *name, size_t size) {
  int fd = shm_open(name, O_CREAT | O_TRUNC | O_RDWR, 0600);
  if (fd < 0) return NULL;
  void *p = MAP_FAILED;
  if (ftruncate(fd, (off_t)size) == 0) p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name);
    return NULL;
  }
  return p;
}

static void write_begin(uint64_t *seq) {
  uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
  __atomic_store_n(seq, s + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void write_end(uint64_t *seq) {
  uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
  __atomic_store_n(seq, s + 1, __ATOMIC_RELEASE);
}

int gp_shm_create(void) {
  snprintf(stats_name, sizeof stats_name, GPUDASH_PRELOAD_STATS_FMT, (int)gp.pid);
  snprintf(knobs_name, sizeof knobs_name, GPUDASH_PRELOAD_KNOBS_FMT, (int)gp.pid);
  stats = map_block(stats_name, sizeof *stats);
  knobs = map_block(knobs_name, sizeof *knobs);
  if (!stats || !knobs) {
    gp_shm_close();
    return -1;
  }
  started_at = wall_now();
  write_begin(&knobs->seq);
  knobs->magic = GPUDASH_PRELOAD_MAGIC;
  knobs->version = GPUDASH_PRELOAD_SHM_VERSION;
  knobs->generation = 0;
  knobs->knobs = in_force;
  knobs->h2d_staging_bytes = in_force_staging[0];
  knobs->d2h_staging_bytes = in_force_staging[1];
  knobs->enabled = 1;
  write_end(&knobs->seq);
  publish_locked();
  return 0;
}

void gp_shm_publish(void) {
  pthread_mutex_lock(&shm_m);
  publish_locked();
  pthread_mutex_unlock(&shm_m);
}

static void publish_locked(void) {
  if (!stats) return;
  static ge_path_stats ps[GPUDASH_PRELOAD_MAX_PATHS];
  static ge_link_stats ls[GPUDASH_PRELOAD_MAX_GPUS];
  int np = 0, ng = 0;
  if (atomic_load(&gp.engine_state) == 2) {
    np = gp.ge.num_paths(gp.eng);
    ng = gp.ge.num_gpus(gp.eng);
    if (np > GPUDASH_PRELOAD_MAX_PATHS) np = GPUDASH_PRELOAD_MAX_PATHS;
    if (ng > GPUDASH_PRELOAD_MAX_GPUS) ng = GPUDASH_PRELOAD_MAX_GPUS;
    gp.ge.stats(gp.eng, ps, np, ls, ng);
  }
  int state = atomic_load(&gp.state);
  if (state == GP_STATE_ACTIVE && !atomic_load(&gp.enabled)) state = GP_STATE_OFF;
  write_begin(&stats->seq);
  stats->magic = GPUDASH_PRELOAD_MAGIC;
  stats->version = GPUDASH_PRELOAD_SHM_VERSION;
  stats->pid = (int32_t)gp.pid;
  stats->state = state;
  stats->num_paths = np;
  stats->num_gpus = ng;
  stats->started_at = started_at;
  stats->updated_at = wall_now();
  memcpy(stats->name, gp.name, sizeof stats->name);
  for (int d = 0; d < 2; ++d) {
    uint64_t *out = &stats->dir[d].copies_taken;
    for (int i = 0; i < 8; ++i) out[i] = atomic_load_explicit(&gp_count[d].v[i], memory_order_relaxed);
  }
  stats->knobs_generation = applied_generation;
  stats->knobs = in_force;
  stats->h2d_staging_bytes = in_force_staging[0];
  stats->d2h_staging_bytes = in_force_staging[1];
  stats->engine_start_ns = atomic_load(&gp.engine_start_ns);
  memcpy(stats->paths, ps, sizeof(ge_path_stats) * (size_t)np);
  memcpy(stats->links, ls, sizeof(ge_link_stats) * (size_t)ng);
  write_end(&stats->seq);
}

/* A consistent copy of the knob block, or -1 while gpudash is writing it (tried again next poll). */
static int read_knobs(gp_knobs_block *out) {
  for (int tries = 0; tries < 64; ++tries) {
    uint64_t s1 = __atomic_load_n(&knobs->seq, __ATOMIC_ACQUIRE);
    if (s1 & 1) continue;
    memcpy(out, knobs, sizeof *out);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&knobs->seq, __ATOMIC_RELAXED) == s1) return 0;
  }
  return -1;
}

static void poll_locked(void);

void gp_shm_poll_knobs(void) {
  pthread_mutex_lock(&shm_m);
  poll_locked();
  pthread_mutex_unlock(&shm_m);
}

static void poll_locked(void) {
  if (!knobs) return;
  if (__atomic_load_n(&knobs->generation, __ATOMIC_RELAXED) == applied_generation) {
    atomic_store(&gp.enabled, __atomic_load_n(&knobs->enabled, __ATOMIC_RELAXED) != 0);
    return;
  }
  gp_knobs_block b;
  if (read_knobs(&b) || b.magic != GPUDASH_PRELOAD_MAGIC) return;
  atomic_store(&gp.enabled, b.enabled != 0);
  if (b.generation == applied_generation || b.generation == __atomic_load_n(&knobs->rejected_generation, __ATOMIC_RELAXED))
    return;
  if (atomic_load(&gp.engine_state) != 2) return;  /* applied once the engine runs */
  uint64_t staging[2] = {b.h2d_staging_bytes, b.d2h_staging_bytes};
  int out_of_range = 0;
#define GP_STAGING_RANGE(f, d, dflt, lo, hi) out_of_range |= outside(staging[d], lo, hi);
  GE_STAGING_KNOBS(GP_STAGING_RANGE)
  if (out_of_range || gp.ge.set_knobs(gp.eng, &b.knobs) != GE_OK) {
    __atomic_store_n(&knobs->rejected_generation, b.generation, __ATOMIC_RELEASE);
    return;
  }
  gp_apply_policy(&b.knobs, staging, 1);
  applied_generation = b.generation;
}

void gp_shm_close(void) {
  pthread_mutex_lock(&shm_m);
  if (stats) {
    munmap(stats, sizeof *stats);
    shm_unlink(stats_name);
    stats = NULL;
  }
  if (knobs) {
    munmap(knobs, sizeof *knobs);
    shm_unlink(knobs_name);
    knobs = NULL;
  }
  pthread_mutex_unlock(&shm_m);
}
