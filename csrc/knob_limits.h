/* Generated from KNOB_TABLE in gpudash/engine/config.py by `python -m gpudash.engine.knob_header`; do not edit.
 * tests/engine/test_knob_table.py fails while this file and the table differ. */
#ifndef GPUDASH_KNOB_LIMITS_H
#define GPUDASH_KNOB_LIMITS_H

/* X(field, C type, byte offset in ge_knobs, lowest, highest) for each knob the data plane reads. */
#define GE_KNOB_TABLE(X) \
  X(h2d_chunk_bytes, uint64_t, 0, 4096ull, 1073741824ull) \
  X(d2h_chunk_bytes, uint64_t, 8, 4096ull, 1073741824ull) \
  X(h2d_fallback_bytes, uint64_t, 16, 0ull, 1125899906842624ull) \
  X(d2h_fallback_bytes, uint64_t, 24, 0ull, 1125899906842624ull) \
  X(outstanding, int32_t, 32, 1, 64) \
  X(direct_first, int32_t, 36, 0, 1) \
  X(staging_threads, int32_t, 40, 1, 64)

#define GE_KNOBS_SIZE 48

/* The range check of ge_knobs (engine_setup.cpp's validate_knobs): nonzero when every knob the data plane
 * reads is within the table's limits. */
#define GE_KNOBS_IN_RANGE(k) \
  ((k).h2d_chunk_bytes >= 4096ull && \
   (k).h2d_chunk_bytes <= 1073741824ull && \
   (k).d2h_chunk_bytes >= 4096ull && \
   (k).d2h_chunk_bytes <= 1073741824ull && \
   (k).h2d_fallback_bytes <= 1125899906842624ull && \
   (k).d2h_fallback_bytes <= 1125899906842624ull && \
   (k).outstanding >= 1 && \
   (k).outstanding <= 64 && \
   (k).direct_first >= 0 && \
   (k).direct_first <= 1 && \
   (k).staging_threads >= 1 && \
   (k).staging_threads <= 64)

/* X(field, default) for the same knobs: a preloaded engine's start-up knobs. 0 where the default is
 * computed on the machine that runs the engine (staging_threads: half its usable cores, 1 to 16). */
#define GE_KNOB_DEFAULTS(X) \
  X(h2d_chunk_bytes, 2810000ull) \
  X(d2h_chunk_bytes, 5370000ull) \
  X(h2d_fallback_bytes, 11300000ull) \
  X(d2h_fallback_bytes, 13000000ull) \
  X(outstanding, 2) \
  X(direct_first, 1) \
  X(staging_threads, 0)

/* X(name, direction, default, lowest, highest) for the live knobs outside ge_knobs: the pageable staging
 * thresholds. */
#define GE_STAGING_KNOBS(X) \
  X(h2d_staging_bytes, GE_H2D, 1048576ull, 0ull, 1125899906842624ull) \
  X(d2h_staging_bytes, GE_D2H, 2097152ull, 0ull, 1125899906842624ull)

#endif
