// The engine's own pools (engine_pools.hpp).
#include "engine_pools.hpp"

#include <algorithm>

#include "engine_core.hpp"

namespace ge {

uint64_t EnginePools::slot_bytes(const ge_knobs &k) {
  return round_page(std::min(std::max(k.h2d_chunk_bytes, k.d2h_chunk_bytes), kSlotBytes));
}

uint64_t EnginePools::relay_bytes(const ge_knobs &k) {
  return round_page(std::max(k.h2d_chunk_bytes, k.d2h_chunk_bytes));
}

uint64_t EnginePools::need(const ge_knobs &k, int which) const {
  if (which == kHost) return kSlots * slot_bytes(k);
  return uint64_t(relays_via_[size_t(which)]) * uint64_t(k.outstanding) * relay_bytes(k);
}

uint64_t EnginePools::need_min(ge_knobs k, int which) const {
  k.outstanding = 1;
  return need(k, which);
}

int EnginePools::create(Backend &be, const std::vector<int> &relays_via, const ge_knobs &k) {
  relays_via_ = relays_via;
  dev_.resize(relays_via.size());
  int rc = make(be, kHost, kSlots * kSlotBytes, k);
  if (rc) return rc;
  for (int g = 0; g < int(dev_.size()); ++g)
    if (need(k, g) && (rc = make(be, g, kPoolHeadroom * need(k, g), k))) return rc;
  return GE_OK;
}

int EnginePools::make(Backend &be, int which, uint64_t slab, const ge_knobs &k) {
  PoolView &P = at(which);
  int rc = which == kHost ? be.alloc_host(slab, &P.slab) : be.alloc_device(which, slab, &P.slab);
  if (rc) return rc;
  P.size = slab;
  P.granule = which == kHost ? kHostGranule : kDeviceGranule;
  if ((rc = gp_pool_create(P.slab, slab, P.granule, &P.pool))) return rc;
  gp_pool_set_policy(P.pool, GP_POLICY_BANDED);  // blocks packed low: few pages ever touched
  uint64_t detail = 0;
  P.floor = need(k, which);
  return gp_shard_add(P.pool, P.floor, &P.shard, &detail);
}

void EnginePools::release(Backend &be) {
  for (int w = kHost; w < int(dev_.size()); ++w) {
    PoolView &P = at(w);
    if (P.pool) gp_pool_destroy(P.pool);
    if (P.slab) w == kHost ? be.free_host(P.slab) : be.free_device(P.slab);
    P = PoolView{};
  }
}

int EnginePools::grow_for(const ge_knobs &k) {
  std::lock_guard<std::mutex> lk(m_);
  for (int w = kHost; w < int(dev_.size()); ++w)
    if (at(w).pool && need_min(k, w) > at(w).size) return GE_ENOMEM;
  for (int w = kHost; w < int(dev_.size()); ++w) {
    PoolView &P = at(w);
    uint64_t n = std::min(need(k, w), P.size), detail = 0;
    gp_shard_stats st{};
    if (!P.pool || n <= P.floor) continue;
    P.floor = n;
    gp_stats(P.pool, P.shard, &st);
    // the shard is its pool's only one, so the slab's unassigned bytes cover the growth
    if (st.capacity < n && gp_shard_resize(P.pool, P.shard, n, &detail)) return GE_ENOMEM;
  }
  return GE_OK;
}

PoolView EnginePools::view(int which) {
  std::lock_guard<std::mutex> lk(m_);
  return at(which);
}

uint64_t EnginePools::take_slot(const ge_knobs &k) {
  if (slots_live_.fetch_add(1) >= kSlots) {
    slots_live_.fetch_sub(1);
    return 0;
  }
  uint64_t ptr = 0, largest = 0;
  if (gp_alloc(host_.pool, host_.shard, slot_bytes(k), 0, &ptr, &largest)) {
    slots_live_.fetch_sub(1);
    return 0;
  }
  return ptr;
}

void EnginePools::release_slot(uint64_t ptr) {
  int shard = 0;
  gp_free(host_.pool, ptr, &shard);
  slots_live_.fetch_sub(1);
}

int EnginePools::relay_get(int via, const ge_knobs &k, uint64_t *ptr) {
  uint64_t largest = 0;
  PoolView &P = dev_[size_t(via)];
  return gp_alloc(P.pool, P.shard, relay_bytes(k), 0, ptr, &largest);
}

void EnginePools::relay_put(int via, uint64_t ptr) {
  int shard = 0;
  PoolView &P = dev_[size_t(via)];
  gp_free(P.pool, ptr, &shard);
}

}  // namespace ge
