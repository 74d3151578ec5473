/* The interposer's life in its host process: the constructor (reads the environment and finds the
 * engine library; no threads, no files), the first door entry (the shared-memory blocks and the
 * publisher thread, and the engine's start on a thread of its own), fork() children and exit() falling
 * back to pass-through. */
#include "preload.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static ge_knobs start_knobs;
static uint64_t start_staging[2];
static char start_error[512];
static int publish_ms = 100;

static void child_after_fork(void) {
  /* The engine's threads did not come along, and the blocks belong to the parent. */
  atomic_store(&gp.state, GP_STATE_PASSTHROUGH);
}

static void at_exit(void) {
  if (getpid() != gp.pid) return;
  if (atomic_load(&gp.state) == GP_STATE_ACTIVE) atomic_store(&gp.state, GP_STATE_PASSTHROUGH);
  gp_shm_publish();
  gp_shm_close();
}

/* Where the engine library is: $GPUDASH_ENGINE_LIB, else beside this library (the wheel's `engine`
 * folder, or the CMake build folder). Settled at start, before the program can change directory. */
static char engine_path[4096];

static void find_engine(void) {
  const char *env = getenv("GPUDASH_ENGINE_LIB");
  Dl_info info;
  char *dir = NULL;
  if (env && *env) snprintf(engine_path, sizeof engine_path, "%s", env);
  else if (dladdr((const void *)find_engine, &info) && info.dli_fname && (dir = realpath(info.dli_fname, NULL))) {
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    snprintf(engine_path, sizeof engine_path, "%s/libgpudash_engine.so", dir);
    free(dir);
  }
}

__attribute__((constructor)) static void gp_init(void) {
  gp.pid = getpid();
  gp_own_add((const void *)gp_init);
  find_engine();
  gp_dlsym_fn();
  atomic_store(&gp.enabled, 1);
  const char *name = getenv("GPUDASH_PRELOAD_NAME");
  snprintf(gp.name, sizeof gp.name, "%s", name ? name : "");
  const char *mode = getenv("GPUDASH_PRELOAD");
  const char *ms = getenv("GPUDASH_PRELOAD_PUBLISH_MS");
  if (ms && atoi(ms) > 0) publish_ms = atoi(ms);
  const char *pinned = getenv("GPUDASH_PRELOAD_PINNED");
  atomic_store(&gp.pinned_always, pinned && strcmp(pinned, "always") == 0);
  int state = GP_STATE_ACTIVE;
  if (gp_startup_knobs(&start_knobs, start_staging, start_error, sizeof start_error)) state = GP_STATE_FAILED;
  else gp_apply_policy(&start_knobs, start_staging, 0);  /* also what the blocks show when off */
  if (mode && strcmp(mode, "off") == 0) state = GP_STATE_OFF;
  atomic_store(&gp.state, state);
  pthread_atfork(NULL, NULL, child_after_fork);
}

static void *publisher(void *arg) {
  (void)arg;
  struct timespec nap = {publish_ms / 1000, (long)(publish_ms % 1000) * 1000000L};
  for (;;) {
    if (atomic_load(&gp.state) == GP_STATE_PASSTHROUGH) return NULL;  /* exit began: at_exit publishes */
    gp_shm_poll_knobs();
    gp_shm_publish();
    nanosleep(&nap, NULL);
  }
}

/* Threads we start never take the host program's signals. */
static void block_signals(sigset_t *old) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, old);
}

static void *starter(void *arg);

/* A detached, named thread of ours that never takes the host program's signals. */
static void spawn(void *(*fn)(void *), const char *name) {
  sigset_t old;
  block_signals(&old);
  pthread_t t;
  if (pthread_create(&t, NULL, fn, NULL) == 0) {
    pthread_setname_np(t, name);
    pthread_detach(t);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void gp_first_entry(int worth_taking) {
  if (!gp.pid) return;  /* a copy before our constructor ran (enabled is still 0: it passes) */
  int expected = 0;
  if (!atomic_compare_exchange_strong(&gp.setup, &expected, 1)) return;  /* another thread is at it */
  int state = atomic_load(&gp.state);
  if (state == GP_STATE_OFF) gp_say("off (GPUDASH_PRELOAD=off): every CUDA copy passes through");
  if (state == GP_STATE_FAILED) gp_say("%s; every CUDA copy passes through", start_error);
  int shm = state == GP_STATE_PASSTHROUGH ? -1 : gp_shm_create();
  if (state != GP_STATE_PASSTHROUGH && shm != 0)  /* EEXIST: another user's file, or no file, has the name */
    gp_say("cannot create the shared-memory blocks in /dev/shm (%s); copies work but their stats are not published",
           strerror(errno));
  if (state != GP_STATE_PASSTHROUGH) atexit(at_exit);
  if (shm == 0) spawn(publisher, "gpudash-stats");
  /* A first copy worth taking starts the engine itself, on its own thread, as it would wait anyway. */
  if (state == GP_STATE_ACTIVE && !worth_taking) spawn(starter, "gpudash-start");
  atomic_store_explicit(&gp.setup, 2, memory_order_release);
}

/* ---- the engine ---------------------------------------------------------------------------- */
static int open_engine(char *why, size_t len) {
  const char *path = engine_path;
  if (!*path) {
    snprintf(why, len, "cannot tell where libgpudash_preload.so lies; set GPUDASH_ENGINE_LIB");
    return -1;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(why, len, "cannot load the engine (%s)", dlerror());
    return -1;
  }
  struct { const char *name; void **slot; } want[] = {
      {"ge_abi_version", (void **)&gp.ge.abi_version}, {"ge_strerror", (void **)&gp.ge.strerror},
      {"ge_create_cuda", (void **)&gp.ge.create_cuda}, {"ge_num_gpus", (void **)&gp.ge.num_gpus},
      {"ge_set_knobs", (void **)&gp.ge.set_knobs},     {"ge_get_knobs", (void **)&gp.ge.get_knobs},
      {"ge_num_paths", (void **)&gp.ge.num_paths},     {"ge_stats", (void **)&gp.ge.stats},
      {"ge_classify", (void **)&gp.ge.classify},       {"ge_copy", (void **)&gp.ge.copy},
      {"ge_wait", (void **)&gp.ge.wait},               {"ge_release", (void **)&gp.ge.release},
      {"ge_copy_sync", (void **)&gp.ge.copy_sync},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; ++i)
    if (!(*want[i].slot = gp_real_dlsym(h, want[i].name))) {
      snprintf(why, len, "%.300s lacks %s; rebuild it", path, want[i].name);
      return -1;
    }
  if (gp.ge.abi_version() != GE_ABI_VERSION) {
    snprintf(why, len, "%.300s has ABI %d, this preload needs %d; rebuild both", path, gp.ge.abi_version(),
             GE_ABI_VERSION);
    return -1;
  }
  gp_own_add((const void *)gp.ge.abi_version);  /* its dlsym calls must reach the real driver */
  return 0;
}

static void note_paths(void) {
  ge_path_stats ps[GPUDASH_PRELOAD_MAX_PATHS];
  ge_link_stats ls[GPUDASH_PRELOAD_MAX_GPUS];
  int n = gp.ge.num_paths(gp.eng);
  if (n > GPUDASH_PRELOAD_MAX_PATHS) n = GPUDASH_PRELOAD_MAX_PATHS;
  gp.ge.stats(gp.eng, ps, n, ls, 0);
  int count[GPUDASH_PRELOAD_MAX_GPUS][2] = {{0}};
  for (int i = 0; i < n; ++i)
    if (ps[i].gpu >= 0 && ps[i].gpu < GPUDASH_PRELOAD_MAX_GPUS) ++count[ps[i].gpu][ps[i].direction & 1];
  for (int g = 0; g < GPUDASH_PRELOAD_MAX_GPUS; ++g)
    for (int d = 0; d < 2; ++d) gp.multipath[g][d] = count[g][d] > 1;
}

/* ---- starting the engine --------------------------------------------------------------------
 * A first door entry by a copy too small to take starts the engine on a thread of its own, so that the
 * first copy worth taking (often the first big one, right after small ones) finds it running; a first
 * copy worth taking starts it itself, on its own thread. A copy that comes while the start is in
 * progress waits for it, up to GP_START_WAIT_S (a start takes ~65 ms on an H200), rather than pass at
 * the driver's pageable speed; the cap bounds the one stall that can happen, a copy made under the
 * dynamic loader's lock (in a library constructor) while the starter thread waits for that lock. */
#define GP_START_WAIT_S 2

static pthread_mutex_t start_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t start_cv = PTHREAD_COND_INITIALIZER;

static void start_done(int engine_state) {
  pthread_mutex_lock(&start_m);
  atomic_store_explicit(&gp.engine_state, engine_state, memory_order_release);
  pthread_cond_broadcast(&start_cv);
  pthread_mutex_unlock(&start_m);
}

static int start_engine(void) {  /* the caller moved engine_state from 0 to 1 */
  uint64_t t0 = gp_now_ns();
  char why[512] = "";
  int ok = 0;
  sigset_t old;
  block_signals(&old);  /* the engine's threads inherit this mask */
  if (open_engine(why, sizeof why) == 0) {
    if (gp_load_driver() != 0) {
      snprintf(why, sizeof why, "libcuda.so.1 lacks a driver function the preload needs");
    } else {
      int rc = gp.ge.create_cuda(&start_knobs, &gp.eng);
      if (rc) snprintf(why, sizeof why, "the engine could not start (%s)", gp.ge.strerror(rc));
      else ok = 1;
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!ok) {
    atomic_store(&gp.state, GP_STATE_FAILED);
    gp_say("%s; every CUDA copy passes through", why);
    start_done(3);
    return 0;
  }
  note_paths();
  gp_apply_policy(&start_knobs, start_staging, 1);  /* before engine_state says running: the paths count */
  atomic_store(&gp.engine_start_ns, gp_now_ns() - t0);
  start_done(2);
  return 1;
}

static int wait_started(void) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += GP_START_WAIT_S;
  pthread_mutex_lock(&start_m);
  while (atomic_load(&gp.engine_state) == 1)
    if (pthread_cond_timedwait(&start_cv, &start_m, &until) == ETIMEDOUT) break;
  pthread_mutex_unlock(&start_m);
  return atomic_load_explicit(&gp.engine_state, memory_order_acquire) == 2;
}

int gp_engine_ready(void) {
  int s = atomic_load_explicit(&gp.engine_state, memory_order_acquire);
  if (GP_LIKELY(s == 2)) return 1;
  if (s == 1) return wait_started();
  if (s != 0) return 0;  /* failed */
  int expected = 0;
  if (!atomic_compare_exchange_strong(&gp.engine_state, &expected, 1)) return wait_started();
  return start_engine();
}

static void *starter(void *arg) {
  (void)arg;
  gp_engine_ready();
  return NULL;
}
