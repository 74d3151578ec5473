/* The start-up knobs (GPUDASH_PRELOAD_KNOBS or defaults), the policy thresholds the doors read, and the
 * two shared-memory blocks of gpudash_preload_shm.h: stats published under a sequence lock, knobs
 * polled and applied when their generation changes. */
#include "preload.h"

#include "knob_limits.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/* Sets one knob by name: 1 when set, 0 when the name is no knob, -1 when the value is out of the knob's
 * range (*lo, *hi set). Names, types, ranges and defaults come from csrc/knob_limits.h, generated from
 * gpudash/engine/config.py's knob table, so the library takes exactly what that table takes. */
static int set_knob(ge_knobs *k, uint64_t staging[2], const char *name, unsigned long long v,
                    unsigned long long *lo, unsigned long long *hi) {
#define GP_SET_NATIVE(f, t, off, l, h)                                       \
  if (!strcmp(name, #f)) {                                                   \
    *lo = (unsigned long long)(l), *hi = (unsigned long long)(h);            \
    if (outside(v, *lo, *hi)) return -1;                                     \
    k->f = (t)v;                                                             \
    return 1;                                                                \
  }
#define GP_SET_STAGING(f, d, dflt, l, h)                                     \
  if (!strcmp(name, #f)) {                                                   \
    *lo = (unsigned long long)(l), *hi = (unsigned long long)(h);            \
    if (outside(v, *lo, *hi)) return -1;                                     \
    staging[d] = v;                                                          \
    return 1;                                                                \
  }
  GE_KNOB_TABLE(GP_SET_NATIVE)
  GE_STAGING_KNOBS(GP_SET_STAGING)
  return 0;
}

/* The value of one name=value item: ASCII digits only (no sign, no blanks: strtoull alone would take
 * "-1" as 2^64-1), and no more than 2^64-1. */
static int parse_value(const char *text, unsigned long long *v) {
  if (*text < '0' || *text > '9') return -1;
  for (const char *c = text; *c; ++c)
    if (*c < '0' || *c > '9') return -1;
  errno = 0;
  *v = strtoull(text, NULL, 10);
  return errno == ERANGE ? -1 : 0;
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
  char *buf = strdup(env);  /* the whole value, however long: nothing is cut */
  if (!buf) {
    snprintf(err, errlen, "no memory to read GPUDASH_PRELOAD_KNOBS (%zu bytes)", strlen(env));
    return -1;
  }
  int rc = 0;
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '=');
    unsigned long long v = 0, lo = 0, hi = 0;
    if (!eq || parse_value(eq + 1, &v)) {
      snprintf(err, errlen, "GPUDASH_PRELOAD_KNOBS item '%.200s' is not name=integer (0 to 2^64-1); fix or unset it",
               item);
      rc = -1;
      break;
    }
    *eq = 0;
    int set = set_knob(k, staging, item, v, &lo, &hi);
    if (set == 0)
      snprintf(err, errlen, "GPUDASH_PRELOAD_KNOBS names an unknown knob '%.100s' (knobs: %.*s); fix or unset it",
               item, (int)sizeof knob_names - 3, knob_names);
    else if (set < 0)
      snprintf(err, errlen, "GPUDASH_PRELOAD_KNOBS %s=%llu is out of range; it must be in [%llu, %llu]; fix or "
               "unset it", item, v, lo, hi);
    if (set <= 0) rc = -1;
  }
  free(buf);
  return rc;
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

/* ---- the blocks ---------------------------------------------------------------------------
 * /dev/shm is open to every local user, so the blocks are never mapped here: a mapped block that someone
 * truncates gives SIGBUS on the next store, which would kill the host program. They are written with
 * pwrite (a truncated block is simply extended again) and read with pread, through fds held open. */
static int stats_fd = -1, knobs_fd = -1;
static char stats_name[64], knobs_name[64];
static double started_at;
static uint64_t stats_seq;  /* this process is the stats block's only writer */
static int keep_blocks;     /* at exit, leave the blocks for `gpudash run --stats` to read and remove */
static pthread_mutex_t shm_m = PTHREAD_MUTEX_INITIALIZER;  /* the publisher vs exit() */
static void publish_locked(void);

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int put(int fd, const void *p, size_t n, size_t off) {
  return pwrite(fd, p, n, (off_t)off) == (ssize_t)n ? 0 : -1;
}

static int get(int fd, void *p, size_t n, size_t off) {
  return pread(fd, p, n, (off_t)off) == (ssize_t)n ? 0 : -1;
}

/* A new block of `size` bytes named `name`, created here (O_EXCL, 0600), or -1. A name already taken is
 * used only when it is a regular file of this user, a leftover of an earlier process with this pid: it is
 * removed and made anew. Anything else there (a FIFO, another user's file) is left alone and refused. */
static int create_block(const char *name, size_t size) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      if (ftruncate(fd, (off_t)size) == 0) return fd;
      close(fd);
      shm_unlink(name);
      return -1;
    }
    if (errno != EEXIST || attempt) return -1;
    struct stat st;
    int old = shm_open(name, O_RDONLY | O_NONBLOCK, 0);  /* glibc adds O_NOFOLLOW */
    int leftover = old >= 0 && fstat(old, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
    if (old >= 0) close(old);
    if (!leftover) {
      errno = EEXIST;
      return -1;
    }
    shm_unlink(name);
  }
  return -1;
}

static void write_begin(int fd, uint64_t *seq, size_t at) {
  *seq += 1;
  put(fd, seq, sizeof *seq, at);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void write_end(int fd, uint64_t *seq, size_t at) {
  __atomic_thread_fence(__ATOMIC_RELEASE);
  *seq += 1;
  put(fd, seq, sizeof *seq, at);
}

static void drop_blocks(void) {
  if (stats_fd >= 0) close(stats_fd), stats_fd = -1;
  if (knobs_fd >= 0) close(knobs_fd), knobs_fd = -1;
}

int gp_shm_create(void) {
  snprintf(stats_name, sizeof stats_name, GPUDASH_PRELOAD_STATS_FMT, (int)gp.pid);
  snprintf(knobs_name, sizeof knobs_name, GPUDASH_PRELOAD_KNOBS_FMT, (int)gp.pid);
  /* `gpudash run` names itself here: its direct child keeps its blocks at exit for it to read. */
  const char *runner = getenv("GPUDASH_PRELOAD_KEEP_FOR");
  keep_blocks = runner && *runner && atoi(runner) == (int)getppid();
  stats_fd = create_block(stats_name, sizeof(gp_stats_block));
  knobs_fd = stats_fd < 0 ? -1 : create_block(knobs_name, sizeof(gp_knobs_block));
  if (stats_fd < 0 || knobs_fd < 0) {
    int why = errno;
    if (stats_fd >= 0) shm_unlink(stats_name);
    drop_blocks();
    errno = why;
    return -1;
  }
  started_at = wall_now();
  gp_knobs_block k;
  memset(&k, 0, sizeof k);
  k.magic = GPUDASH_PRELOAD_MAGIC;
  k.version = GPUDASH_PRELOAD_SHM_VERSION;
  k.knobs = in_force;
  k.h2d_staging_bytes = in_force_staging[0];
  k.d2h_staging_bytes = in_force_staging[1];
  k.enabled = 1;
  put(knobs_fd, &k, sizeof k, 0);
  publish_locked();
  return 0;
}

/* ---- the CPU of our threads ----------------------------------------------------------------- */
/* Our threads are the ones named ge-* (the engine's) or gpudash-* (the interposer's). Finding them means
 * reading every thread's comm from /proc (about 7 us a thread: 0.7 ms in a process of 100 threads, at every
 * publish while bytes move), so the tids found are kept and looked for again at most once a second: ours
 * start with the engine, so a later one is missed for under a second. Each publish reads the kept threads'
 * CPU clocks instead (one call a thread, no file). Under shm_m. */
#define OWN_SEARCH_NS 1000000000ull
static pid_t *own_tids;
static size_t own_n, own_cap;
static uint64_t own_found_at;

static void find_own_threads(void) {
  DIR *dir = opendir("/proc/self/task");
  if (!dir) return;
  own_n = 0;
  struct dirent *e;
  while ((e = readdir(dir))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], comm[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "re");
    if (!f) continue;
    int named = fgets(comm, sizeof comm, f) && (!strncmp(comm, "ge-", 3) || !strncmp(comm, "gpudash-", 8));
    fclose(f);
    if (!named) continue;
    if (own_n == own_cap) {
      size_t cap = own_cap ? 2 * own_cap : 64;
      pid_t *more = realloc(own_tids, cap * sizeof *more);
      if (!more) break;  /* counted: the threads found so far */
      own_tids = more, own_cap = cap;
    }
    own_tids[own_n++] = (pid_t)atoi(e->d_name);
  }
  closedir(dir);
}

/* A thread's CPU clock by tid, as the kernel encodes it (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED), which
 * glibc's pthread_getcpuclockid returns for its own threads): the engine's threads are C++ std::threads,
 * whose pthread_t we never see. */
static clockid_t thread_clock(pid_t tid) { return (clockid_t)((~(unsigned)tid << 3) | 6); }

/* The on-CPU time of our threads (ns), the cost gpudash adds beside the callers' time inside taken calls. A
 * thread that has ended drops out of the sum, as it drops out of /proc. */
static uint64_t own_threads_cpu_ns(void) {
  uint64_t now = gp_now_ns();
  if (!own_found_at || now - own_found_at >= OWN_SEARCH_NS) find_own_threads(), own_found_at = now;
  uint64_t sum = 0;
  for (size_t i = 0; i < own_n; ++i) {
    struct timespec ts;
    if (clock_gettime(thread_clock(own_tids[i]), &ts) == 0) sum += (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
  }
  return sum;
}

void gp_shm_publish(void) {
  pthread_mutex_lock(&shm_m);
  publish_locked();
  pthread_mutex_unlock(&shm_m);
}

static void publish_locked(void) {
  if (stats_fd < 0) return;
  static gp_stats_block out;  /* built here, then written in one pwrite between the two seq updates */
  int np = 0, ng = 0;
  memset(out.paths, 0, sizeof out.paths);
  memset(out.links, 0, sizeof out.links);
  if (atomic_load(&gp.engine_state) == 2) {
    np = gp.ge.num_paths(gp.eng);
    ng = gp.ge.num_gpus(gp.eng);
    if (np > GPUDASH_PRELOAD_MAX_PATHS) np = GPUDASH_PRELOAD_MAX_PATHS;
    if (ng > GPUDASH_PRELOAD_MAX_GPUS) ng = GPUDASH_PRELOAD_MAX_GPUS;
    gp.ge.stats(gp.eng, out.paths, np, out.links, ng);
  }
  int state = atomic_load(&gp.state);
  if (state == GP_STATE_ACTIVE && !atomic_load(&gp.enabled)) state = GP_STATE_OFF;
  const size_t seq_at = offsetof(gp_stats_block, seq);
  write_begin(stats_fd, &stats_seq, seq_at);
  out.seq = stats_seq;
  out.magic = GPUDASH_PRELOAD_MAGIC;
  out.version = GPUDASH_PRELOAD_SHM_VERSION;
  out.pid = (int32_t)gp.pid;
  out.state = state;
  out.num_paths = np;
  out.num_gpus = ng;
  out.started_at = started_at;
  out.updated_at = wall_now();
  memcpy(out.name, gp.name, sizeof out.name);
  for (int d = 0; d < 2; ++d) {
    uint64_t *o = &out.dir[d].copies_taken;
    for (int i = 0; i < GP_C_N; ++i) o[i] = atomic_load_explicit(&gp_count[d].v[i], memory_order_relaxed);
  }
  out.knobs_generation = applied_generation;
  out.knobs = in_force;
  out.h2d_staging_bytes = in_force_staging[0];
  out.d2h_staging_bytes = in_force_staging[1];
  out.engine_start_ns = atomic_load(&gp.engine_start_ns);
  out.threads_cpu_ns = own_threads_cpu_ns();
  put(stats_fd, &out, sizeof out, 0);
  write_end(stats_fd, &stats_seq, seq_at);
}

/* A consistent copy of the knob block, or -1 while gpudash is writing it (tried again next poll) or
 * when the block is short (truncated by someone: tried again too). */
static int read_knobs(gp_knobs_block *out) {
  const size_t seq_at = offsetof(gp_knobs_block, seq);
  for (int tries = 0; tries < 64; ++tries) {
    uint64_t s2 = 0;
    if (get(knobs_fd, out, sizeof *out, 0)) return -1;
    if (out->seq & 1) continue;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (get(knobs_fd, &s2, sizeof s2, seq_at) == 0 && s2 == out->seq) return 0;
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
  if (knobs_fd < 0) return;
  uint64_t generation = 0;
  int32_t enabled = 1;
  if (get(knobs_fd, &generation, sizeof generation, offsetof(gp_knobs_block, generation)) == 0 &&
      generation == applied_generation) {
    if (get(knobs_fd, &enabled, sizeof enabled, offsetof(gp_knobs_block, enabled)) == 0)
      atomic_store(&gp.enabled, enabled != 0);
    return;
  }
  gp_knobs_block b;
  if (read_knobs(&b) || b.magic != GPUDASH_PRELOAD_MAGIC) return;
  atomic_store(&gp.enabled, b.enabled != 0);
  if (b.generation == applied_generation || b.generation == b.rejected_generation) return;
  if (atomic_load(&gp.engine_state) != 2) return;  /* applied once the engine runs */
  uint64_t staging[2] = {b.h2d_staging_bytes, b.d2h_staging_bytes};
  int out_of_range = 0;
#define GP_STAGING_RANGE(f, d, dflt, lo, hi) out_of_range |= outside(staging[d], lo, hi);
  GE_STAGING_KNOBS(GP_STAGING_RANGE)
  if (out_of_range || gp.ge.set_knobs(gp.eng, &b.knobs) != GE_OK) {
    put(knobs_fd, &b.generation, sizeof b.generation, offsetof(gp_knobs_block, rejected_generation));
    return;
  }
  gp_apply_policy(&b.knobs, staging, 1);
  applied_generation = b.generation;
}

void gp_shm_close(void) {
  pthread_mutex_lock(&shm_m);
  if (stats_fd >= 0 && !keep_blocks) {
    shm_unlink(stats_name);
    shm_unlink(knobs_name);
  }
  drop_blocks();
  pthread_mutex_unlock(&shm_m);
}
