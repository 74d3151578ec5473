/* Stands in for a preloaded process's shared-memory side, built on gpudash_preload_shm.h alone: it
 * creates both blocks for its own pid, publishes stats under the sequence lock and applies (or refuses)
 * the knob blocks gpudash writes, polling them every 10 ms like the interposer does. Commands on stdin,
 * one per line, each answered with one line on stdout:
 *   copy h2d|d2h BYTES NS_IN_CALLS NS_TO_LANDED   one taken copy on direct:0 (and its counters)
 *   pass h2d|d2h BYTES                            one copy passed through
 *   at SECONDS                                    set updated_at (rates come from its deltas)
 *   refuse 0|1                                    refuse knob blocks from now on (or not)
 *   knobs                                         print the knob block as applied last
 *   spin N                                        N publishes in a row, each setting every counter to i
 *   hold                                          leave the stats block's seq odd (a writer stuck mid-write)
 *   quit | exit                                   unlink both blocks and exit 0 | exit 3 leaving them behind
 */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gpudash_preload_shm.h"

static char stats_name[96], knobs_name[96];
static gp_stats_block *S;
static gp_knobs_block *K;
static int refuse;

static void *make(const char *fmt, char *name, size_t size) {
  snprintf(name, 96, fmt, (int)getpid());
  int fd = shm_open(name, O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) { perror("shm"); exit(1); }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  return p;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void begin(void) {
  __atomic_store_n(&S->seq, S->seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}
static void end(void) { __atomic_store_n(&S->seq, S->seq + 1, __ATOMIC_RELEASE); }

/* A consistent copy of the knob block (the reader side of the sequence lock). */
static gp_knobs_block read_knobs(void) {
  gp_knobs_block c;
  for (;;) {
    uint64_t s1 = __atomic_load_n(&K->seq, __ATOMIC_ACQUIRE);
    if (s1 & 1) continue;
    memcpy(&c, K, sizeof c);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&K->seq, __ATOMIC_RELAXED) == s1) return c;
  }
}

static void poll_knobs(void) {
  gp_knobs_block c = read_knobs();
  if (c.generation == 0 || c.generation == S->knobs_generation || c.generation == K->rejected_generation) return;
  if (refuse) {
    __atomic_store_n(&K->rejected_generation, c.generation, __ATOMIC_RELEASE);
    return;
  }
  begin();
  S->knobs = c.knobs;
  S->h2d_staging_bytes = c.h2d_staging_bytes;
  S->d2h_staging_bytes = c.d2h_staging_bytes;
  S->knobs_generation = c.generation;
  end();
}

int main(void) {
  S = make(GPUDASH_PRELOAD_STATS_FMT, stats_name, sizeof *S);
  K = make(GPUDASH_PRELOAD_KNOBS_FMT, knobs_name, sizeof *K);
  const char *name = getenv("GPUDASH_PRELOAD_NAME");
  ge_knobs k0 = {2810000, 5370000, 11300000, 13000000, 2, 1, 4, 0};
  K->magic = GPUDASH_PRELOAD_MAGIC;
  K->version = GPUDASH_PRELOAD_SHM_VERSION;
  K->enabled = 1;
  K->knobs = k0;
  begin();
  S->magic = GPUDASH_PRELOAD_MAGIC;
  S->version = GPUDASH_PRELOAD_SHM_VERSION;
  S->pid = (int32_t)getpid();
  S->state = GP_STATE_ACTIVE;
  S->num_gpus = 1;
  S->num_paths = 2;
  S->started_at = S->updated_at = now();
  snprintf(S->name, sizeof S->name, "%s", name ? name : "");
  S->knobs = k0;
  S->h2d_staging_bytes = 16u << 20;
  S->d2h_staging_bytes = 4u << 20;
  S->paths[0].direction = GE_H2D;
  S->paths[1].direction = GE_D2H;
  end();
  setvbuf(stdin, NULL, _IONBF, 0); /* poll() sees every line that is not read yet */
  printf("ready %d\n", (int)getpid());
  fflush(stdout);

  char line[256];
  struct pollfd in = {0, POLLIN, 0};
  for (;;) {
    poll_knobs();
    if (poll(&in, 1, 10) <= 0) continue;
    if (!fgets(line, sizeof line, stdin)) break;
    char dir[8] = "";
    unsigned long long a = 0, b = 0, c = 0;
    double t;
    if (sscanf(line, "copy %7s %llu %llu %llu", dir, &a, &b, &c) == 4) {
      int d = strcmp(dir, "d2h") == 0 ? GE_D2H : GE_H2D;
      begin();
      S->dir[d].copies_taken++;
      S->dir[d].bytes_taken += a;
      S->dir[d].ns_in_calls_taken += b;
      S->dir[d].ns_to_landed_taken += c;
      S->paths[d].bytes += a;
      S->paths[d].chunks++;
      S->links[0].h2d_bytes += d == GE_H2D ? a : 0;
      S->links[0].d2h_bytes += d == GE_D2H ? a : 0;
      end();
    } else if (sscanf(line, "cpu %7s %llu %llu", dir, &a, &b) == 3) {  /* callers' ns in calls, our threads' ns */
      int d = strcmp(dir, "d2h") == 0 ? GE_D2H : GE_H2D;
      begin();
      S->dir[d].cpu_ns_calls_taken += a;
      S->threads_cpu_ns += b;
      end();
    } else if (sscanf(line, "pass %7s %llu", dir, &a) == 2) {
      int d = strcmp(dir, "d2h") == 0 ? GE_D2H : GE_H2D;
      begin();
      S->dir[d].copies_passed++;
      S->dir[d].bytes_passed += a;
      end();
    } else if (sscanf(line, "at %lf", &t) == 1) {
      begin();
      S->updated_at = t;
      end();
    } else if (sscanf(line, "refuse %llu", &a) == 1) {
      refuse = (int)a;
    } else if (strncmp(line, "knobs", 5) == 0) {
      gp_knobs_block k = read_knobs();
      printf("generation %llu h2d_chunk_bytes %llu staging_threads %d direct_first %d h2d_staging_bytes %llu "
             "enabled %d\n", (unsigned long long)k.generation, (unsigned long long)k.knobs.h2d_chunk_bytes,
             k.knobs.staging_threads, k.knobs.direct_first, (unsigned long long)k.h2d_staging_bytes, k.enabled);
      fflush(stdout);
      continue;
    } else if (sscanf(line, "spin %llu", &a) == 1) {
      for (unsigned long long i = 1; i <= a; i++) {
        begin();
        uint64_t *w = (uint64_t *)S->dir;
        for (size_t j = 0; j < 2 * sizeof(gp_direction_stats) / sizeof(uint64_t); j++) w[j] = i;
        end();
        for (volatile int gap = 0; gap < 2000; gap++) {
        } /* a moment between publishes, as the interposer's are 100 ms apart: readers get through */
      }
    } else if (strncmp(line, "hold", 4) == 0) {
      begin();
    } else if (strncmp(line, "exit", 4) == 0) {
      return 3;
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    }
    printf("ok\n");
    fflush(stdout);
  }
  shm_unlink(stats_name);
  shm_unlink(knobs_name);
  return 0;
}
