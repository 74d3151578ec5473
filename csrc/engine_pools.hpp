// The engine's own pools (gpudash_pool.h): the staging ring's slots are blocks of the pinned host pool's
// "staging" shard, relay buffers blocks of the via GPU's device pool "relay" shard. A chunk takes its
// block when it is issued and gives it back when it lands, so the shard stats show what copies hold
// now; taking a block is one pool call (a lock and a tree look-up), no driver call.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "gpudash_engine.h"
#include "gpudash_pool.h"

namespace ge {

class Backend;

inline constexpr int kSlots = 32;                       // the staging ring's depth
inline constexpr uint64_t kSlotBytes = 4ull << 20;      // the largest staging slot
inline constexpr int kPoolHeadroom = 4;                 // a relay pool's slab holds 4x what the creation knobs need
inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint64_t kHostGranule = kPageBytes;    // page-aligned staging slots
inline constexpr uint64_t kDeviceGranule = 256;         // cuMemAlloc aligns device memory to 256 B

inline uint64_t round_page(uint64_t v) { return (v + kPageBytes - 1) & ~(kPageBytes - 1); }

// What the C ABI shows of one pool (ge_engine_pool).
struct PoolView {
  gp_pool *pool = nullptr;  // null: that GPU carries no relay path
  int shard = -1;
  uint64_t slab = 0, size = 0, granule = 0;
  uint64_t floor = 0;       // capacity the engine needs: the largest any knob setting asked for
};

class EnginePools {
 public:
  // Pool `which` is -1 for the pinned host pool, else a GPU's device pool.
  static constexpr int kHost = -1;

  EnginePools() = default;
  EnginePools(const EnginePools &) = delete;
  EnginePools &operator=(const EnginePools &) = delete;

  // Allocates the host pool's slab (the whole ring) and a device pool for every GPU that relay paths
  // pass through; relays_via[g] is the number of relay paths through GPU g. Pair with release().
  int create(Backend &be, const std::vector<int> &relays_via, const ge_knobs &k);
  // Destroys the pools and gives their slabs back to the backend.
  void release(Backend &be);

  // Under one knob setting every block of a shard has the same size, so a shard never fragments: a
  // staging slot holds the largest staged chunk (at most kSlotBytes), a relay buffer the largest chunk.
  static uint64_t slot_bytes(const ge_knobs &k);
  static uint64_t relay_bytes(const ge_knobs &k);

  // Shard bytes pool `which` needs under knobs k: the ring's slots, or `outstanding` buffers for every
  // relay path through GPU `which` (with fewer, a relay chunk waits for a block and the direct path
  // may take it meanwhile); need_min: one chunk on every relay path (all the ring's slots).
  uint64_t need(const ge_knobs &k, int which) const;
  uint64_t need_min(ge_knobs k, int which) const;

  // Grows every shard to what knobs k need (at most its whole pool); GE_ENOMEM and nothing changed
  // when a pool cannot hold need_min. Shards never shrink here: a copy in flight may still use the
  // older sizes.
  int grow_for(const ge_knobs &k);

  PoolView view(int which);

  // A staging slot for a chunk copied under knobs k, or 0 while the ring is at its depth or the shard
  // has no room (the caller waits; a slot that did not fit counts as a failure in the shard's stats).
  // Pair with release_slot().
  uint64_t take_slot(const ge_knobs &k);
  void release_slot(uint64_t ptr);

  // A relay buffer of the via GPU's "relay" shard (GE_OK or the pool's error). Pair with relay_put().
  int relay_get(int via, const ge_knobs &k, uint64_t *ptr);
  void relay_put(int via, uint64_t ptr);

 private:
  PoolView &at(int which) { return which == kHost ? host_ : dev_[size_t(which)]; }
  int make(Backend &be, int which, uint64_t slab, const ge_knobs &k);

  std::mutex m_;                   // guards the views' sizes (floor) against grow_for
  PoolView host_;
  std::vector<PoolView> dev_;      // per GPU
  std::vector<int> relays_via_;    // relay paths through each GPU
  std::atomic<int> slots_live_{0};  // staging blocks held (at most kSlots: the ring's depth)
};

}  // namespace ge
