/* Prints the size of each struct of gpudash_preload_shm.h and the offset of each field, one per line
 * ("struct field offset"), for test_shm_layout.py to compare with gpudash/preload/shm.py's ctypes. */
#include <stddef.h>
#include <stdio.h>

#include "gpudash_preload_shm.h"

#define SIZE(T) printf(#T " sizeof %zu\n", sizeof(T))
#define OFF(T, f) printf(#T " " #f " %zu\n", offsetof(T, f))

int main(void) {
  SIZE(gp_direction_stats);
  OFF(gp_direction_stats, copies_taken); OFF(gp_direction_stats, copies_passed);
  OFF(gp_direction_stats, bytes_taken); OFF(gp_direction_stats, bytes_passed);
  OFF(gp_direction_stats, ns_in_calls_taken); OFF(gp_direction_stats, ns_to_landed_taken);
  OFF(gp_direction_stats, staged_copies); OFF(gp_direction_stats, errors);
  OFF(gp_direction_stats, passed_why); OFF(gp_direction_stats, cpu_ns_calls_taken);
  SIZE(gp_stats_block);
  OFF(gp_stats_block, magic); OFF(gp_stats_block, version); OFF(gp_stats_block, seq); OFF(gp_stats_block, pid);
  OFF(gp_stats_block, state); OFF(gp_stats_block, num_paths); OFF(gp_stats_block, num_gpus);
  OFF(gp_stats_block, started_at); OFF(gp_stats_block, updated_at); OFF(gp_stats_block, name);
  OFF(gp_stats_block, dir); OFF(gp_stats_block, knobs_generation); OFF(gp_stats_block, knobs);
  OFF(gp_stats_block, h2d_staging_bytes); OFF(gp_stats_block, d2h_staging_bytes);
  OFF(gp_stats_block, engine_start_ns); OFF(gp_stats_block, threads_cpu_ns); OFF(gp_stats_block, paths);
  OFF(gp_stats_block, links);
  SIZE(gp_knobs_block);
  OFF(gp_knobs_block, magic); OFF(gp_knobs_block, version); OFF(gp_knobs_block, seq);
  OFF(gp_knobs_block, generation); OFF(gp_knobs_block, knobs); OFF(gp_knobs_block, h2d_staging_bytes);
  OFF(gp_knobs_block, d2h_staging_bytes); OFF(gp_knobs_block, enabled); OFF(gp_knobs_block, reserved);
  OFF(gp_knobs_block, rejected_generation);
  printf("consts magic %u version %d max_paths %d name_len %d\n", GPUDASH_PRELOAD_MAGIC,
         GPUDASH_PRELOAD_SHM_VERSION, GPUDASH_PRELOAD_MAX_PATHS, GPUDASH_PRELOAD_NAME_LEN);
  printf("consts states %d %d %d %d\n", GP_STATE_ACTIVE, GP_STATE_OFF, GP_STATE_FAILED, GP_STATE_PASSTHROUGH);
  printf("consts fmt %s %s\n", GPUDASH_PRELOAD_STATS_FMT, GPUDASH_PRELOAD_KNOBS_FMT);
  printf("consts why %d %d %d\n", GP_WHY_N, GP_WHY_PINNED, GP_WHY_FAILED);
  return 0;
}
