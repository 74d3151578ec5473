/* gpudash memory pools: a slab (pinned host or device memory the caller allocated through the engine)
 * split into named shards; best-fit allocation with coalescing inside each shard.
 *
 * The pool manages addresses only: it never touches the bytes, so the same code serves host and
 * device slabs. Functions return GE_OK or a GE_E* code from gpudash_engine.h; details come back
 * through out-parameters so Python can build one clear sentence.
 */
#ifndef GPUDASH_POOL_H
#define GPUDASH_POOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gp_pool gp_pool;

typedef struct {
  uint64_t capacity;
  uint64_t used;          /* bytes in live allocations (rounded to the pool granule) */
  uint64_t free;
  uint64_t largest_free;
  uint64_t free_blocks;
  uint64_t failures;      /* allocations refused because nothing fit */
  uint64_t allocations;   /* live allocations */
  uint64_t extents;       /* contiguous slab ranges the shard spans */
  double fragmentation;   /* 1 - largest_free / free; 0 when free == 0 */
} gp_shard_stats;

typedef struct {
  uint64_t allocs;
  uint64_t frees;
  uint64_t failures;
  uint64_t checks;
  int64_t failed_at;     /* op index where an invariant check failed, -1 if none */
  double seconds;        /* wall time of the replay loop (steady clock) */
  double peak_fragmentation;  /* max over samples of the most fragmented shard */
  uint64_t peak_used;
  double mean_fragmentation;  /* mean over samples of the most fragmented shard */
  uint64_t samples;
} gp_replay_result;

/* How a shard picks among free blocks that fit. BEST: the smallest (lowest address on ties).
 * BANDED: the lowest address among blocks up to 4x the request (at most 64 looked at), else the
 * smallest; it keeps allocations packed low and the large free space in one piece. */
enum { GP_POLICY_BEST = 0, GP_POLICY_BANDED = 1 };

/* base: slab start (must be a multiple of granule); granule: power of two, every block is a multiple. */
int gp_pool_create(uint64_t base, uint64_t size, uint64_t granule, gp_pool **out);
void gp_pool_destroy(gp_pool *p);
/* Slab bytes no shard owns. */
uint64_t gp_pool_unassigned(gp_pool *p);
int gp_pool_set_policy(gp_pool *p, int policy);

/* A new shard taking `capacity` bytes of unassigned slab; GE_ENOMEM (detail: unassigned bytes) if short. */
int gp_shard_add(gp_pool *p, uint64_t capacity, int *shard, uint64_t *detail);
/* Returns the shard's space to the slab; GE_EBUSY (detail: live allocations) while it has any. */
int gp_shard_remove(gp_pool *p, int shard, uint64_t *detail);
/* Grow (takes unassigned slab; GE_ENOMEM, detail = unassigned bytes, if short) or shrink (only free
 * space at the end of the shard; GE_EBUSY, detail = bytes that could go, otherwise). All or nothing. */
int gp_shard_resize(gp_pool *p, int shard, uint64_t capacity, uint64_t *detail);
int gp_stats(gp_pool *p, int shard, gp_shard_stats *out);

/* align: 0 for the granule, else a power of two. GE_ENOMEM when it does not fit (detail: largest free). */
int gp_alloc(gp_pool *p, int shard, uint64_t nbytes, uint64_t align, uint64_t *ptr, uint64_t *detail);
/* GE_EFREED when ptr is not the start of a live allocation; *shard gets the owning shard on success. */
int gp_free(gp_pool *p, uint64_t ptr, int *shard);
/* Size of the live allocation at ptr and its shard; GE_EFREED if none. */
int gp_lookup(gp_pool *p, uint64_t ptr, uint64_t *nbytes, int *shard);

/* Walks every structure and checks the invariants (tiling of the slab, no overlap, coalesced
 * neighbours, counters, fragmentation). GE_OK, or GE_EINVAL with the first violation in msg. */
int gp_check(gp_pool *p, char *msg, int cap);

/* Replays a trace without Python: op[i] 0 = alloc size[i] bytes (align[i], or the granule when align is
 * NULL) in shard[i] into slot[i]; 1 = free slot[i] (skipped if that alloc failed). check_every > 0 runs
 * gp_check every that many ops (msg gets the violation); sample_every > 0 samples fragmentation.
 * Allocations still live at the end are freed after the clock stops, so the pool is reusable. */
int gp_replay(gp_pool *p, uint64_t n, const int32_t *op, const int32_t *shard, const uint64_t *size,
              const uint64_t *align, const uint32_t *slot, uint64_t check_every, uint64_t sample_every,
              gp_replay_result *out, char *msg, int cap);

#ifdef __cplusplus
}
#endif
#endif
