/* The process state every other file of the preload reads: the policy and engine handles (gp), the
 * counters the publisher copies out (gp_count), this thread's nesting depth in original functions, the
 * clock and the one-line messages. It depends on no other file of csrc/preload/, so no two of them
 * depend on each other through it (tests/preload/test_preload_units.py holds that). */
#include "preload.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

gp_global gp;
gp_counters gp_count[2];
__thread int gp_nested __attribute__((tls_model("initial-exec")));

uint64_t gp_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void gp_say(const char *fmt, ...) {
  char line[1024];
  int n = snprintf(line, sizeof line, "gpudash preload: ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  line[len++] = '\n';
  ssize_t w = write(2, line, len);
  (void)w;
}
