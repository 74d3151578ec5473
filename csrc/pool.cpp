// Sharded best-fit pool (gpudash_pool.h): free blocks of a shard sit in a (size, node) set, so the
// smallest block that fits is found in O(log n); every block sits in an address-ordered list, so a
// freed block merges with touching free neighbours in O(1). Blocks are multiples of the granule.
#include "pool.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>

namespace gp {

namespace {
constexpr uint64_t kMaxBytes = 1ull << 62;
constexpr uint64_t kBand = 4;     // banded policy: blocks up to 4x the request compete on address
constexpr int kBandScan = 64;     // ... looking at no more than this many of them
uint64_t round_up(uint64_t v, uint64_t g) { return (v + g - 1) & ~(g - 1); }
}  // namespace

Pool::Pool(uint64_t base, uint64_t size, uint64_t granule) : base_(base), size_(size), granule_(granule) {
  unassigned_[0] = size;
  live_.reserve(1024);
}

int32_t Pool::new_node() {
  if (!spare_.empty()) {
    int32_t i = spare_.back();
    spare_.pop_back();
    nodes_[i] = Node{};
    return i;
  }
  nodes_.emplace_back();
  return int32_t(nodes_.size() - 1);
}

void Pool::drop_node(int32_t i) {
  nodes_[i].shard = -1;
  spare_.push_back(i);
}

void Pool::link_after(Shard &s, int32_t after, int32_t i) {
  int32_t nx = after < 0 ? s.head : nodes_[after].next;
  nodes_[i].prev = after;
  nodes_[i].next = nx;
  if (after < 0) s.head = i; else nodes_[after].next = i;
  if (nx < 0) s.tail = i; else nodes_[nx].prev = i;
}

void Pool::unlink(Shard &s, int32_t i) {
  int32_t p = nodes_[i].prev, nx = nodes_[i].next;
  if (p < 0) s.head = nx; else nodes_[p].next = nx;
  if (nx < 0) s.tail = p; else nodes_[nx].prev = p;
}

int32_t Pool::merge_free(Shard &s, int32_t i) {
  int32_t p = nodes_[i].prev;
  if (p >= 0 && nodes_[p].free && nodes_[p].off + nodes_[p].size == nodes_[i].off) {
    del_free(s, p);
    nodes_[p].size += nodes_[i].size;
    unlink(s, i);
    drop_node(i);
    i = p;
  }
  int32_t nx = nodes_[i].next;
  if (nx >= 0 && nodes_[nx].free && nodes_[i].off + nodes_[i].size == nodes_[nx].off) {
    del_free(s, nx);
    nodes_[i].size += nodes_[nx].size;
    unlink(s, nx);
    drop_node(nx);
  }
  return i;
}

void Pool::give_range(Shard &s, uint64_t off, uint64_t size) {
  int32_t after = s.tail;
  while (after >= 0 && nodes_[after].off > off) after = nodes_[after].prev;
  int32_t i = new_node();
  nodes_[i].off = off;
  nodes_[i].size = size;
  nodes_[i].shard = int32_t(&s - shards_.data());
  nodes_[i].free = true;
  link_after(s, after, i);
  s.capacity += size;
  s.free_bytes += size;
  add_free(s, merge_free(s, i));
}

uint64_t Pool::unassigned() {
  uint64_t total = 0;
  for (auto &r : unassigned_) total += r.second;
  return total;
}

void Pool::take_unassigned(uint64_t need, uint64_t prefer_off, std::vector<std::pair<uint64_t, uint64_t>> *out) {
  auto carve = [&](std::map<uint64_t, uint64_t>::iterator it) {
    uint64_t off = it->first, size = it->second, take = std::min(size, need);
    unassigned_.erase(it);
    if (take < size) unassigned_[off + take] = size - take;
    out->push_back({off, take});
    need -= take;
  };
  auto it = unassigned_.find(prefer_off);
  if (it != unassigned_.end()) carve(it);
  if (!need) return;
  auto best = unassigned_.end();
  for (auto r = unassigned_.begin(); r != unassigned_.end(); ++r)
    if (r->second >= need && (best == unassigned_.end() || r->second < best->second)) best = r;
  if (best != unassigned_.end()) {
    carve(best);
    return;
  }
  while (need && !unassigned_.empty()) carve(unassigned_.begin());
}

void Pool::return_unassigned(uint64_t off, uint64_t size) {
  auto it = unassigned_.emplace(off, size).first;
  auto nx = std::next(it);
  if (nx != unassigned_.end() && off + size == nx->first) {
    it->second += nx->second;
    unassigned_.erase(nx);
  }
  if (it != unassigned_.begin()) {
    auto p = std::prev(it);
    if (p->first + p->second == it->first) {
      p->second += it->second;
      unassigned_.erase(it);
    }
  }
}

uint64_t Pool::tail_free(const Shard &s) const {
  uint64_t got = 0;
  for (int32_t i = s.tail; i >= 0 && nodes_[i].free; i = nodes_[i].prev) got += nodes_[i].size;
  return got;
}

double Pool::fragmentation(const Shard &s) const {
  if (s.free_bytes == 0) return 0.0;
  uint64_t largest = s.by_size.empty() ? 0 : std::get<0>(*s.by_size.rbegin());
  return 1.0 - double(largest) / double(s.free_bytes);
}

int Pool::shard_add(uint64_t capacity, int *shard, uint64_t *detail) {
  std::lock_guard<std::mutex> lk(m_);
  if (capacity == 0 || capacity > kMaxBytes) return GE_EINVAL;
  capacity = round_up(capacity, granule_);
  uint64_t avail = unassigned();
  if (capacity > avail) {
    *detail = avail;
    return GE_ENOMEM;
  }
  shards_.emplace_back();
  Shard &s = shards_.back();
  s.live = true;
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  take_unassigned(capacity, ~0ull, &pieces);
  for (auto &pc : pieces) give_range(s, pc.first, pc.second);
  *shard = int(shards_.size() - 1);
  return GE_OK;
}

int Pool::shard_remove(int shard, uint64_t *detail) {
  std::lock_guard<std::mutex> lk(m_);
  if (!valid_shard(shard)) return GE_ENODEV;
  Shard &s = shards_[shard];
  if (s.allocations) {
    *detail = s.allocations;
    return GE_EBUSY;
  }
  for (int32_t i = s.head; i >= 0;) {
    int32_t nx = nodes_[i].next;
    return_unassigned(nodes_[i].off, nodes_[i].size);
    drop_node(i);
    i = nx;
  }
  s = Shard{};
  return GE_OK;
}

int Pool::shard_resize(int shard, uint64_t capacity, uint64_t *detail) {
  std::lock_guard<std::mutex> lk(m_);
  if (!valid_shard(shard)) return GE_ENODEV;
  if (capacity == 0 || capacity > kMaxBytes) return GE_EINVAL;
  capacity = round_up(capacity, granule_);
  Shard &s = shards_[shard];
  if (capacity > s.capacity) {
    uint64_t need = capacity - s.capacity, avail = unassigned();
    if (need > avail) {
      *detail = avail;
      return GE_ENOMEM;
    }
    uint64_t end = s.tail >= 0 ? nodes_[s.tail].off + nodes_[s.tail].size : ~0ull;
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
    take_unassigned(need, end, &pieces);
    for (auto &pc : pieces) give_range(s, pc.first, pc.second);
    return GE_OK;
  }
  uint64_t cut = s.capacity - capacity, can = tail_free(s);
  if (cut > can) {
    *detail = can;
    return GE_EBUSY;
  }
  while (cut) {
    int32_t t = s.tail;
    del_free(s, t);
    uint64_t take = std::min(cut, nodes_[t].size);
    nodes_[t].size -= take;
    return_unassigned(nodes_[t].off + nodes_[t].size, take);
    if (nodes_[t].size) {
      add_free(s, t);
    } else {
      unlink(s, t);
      drop_node(t);
    }
    s.capacity -= take;
    s.free_bytes -= take;
    cut -= take;
  }
  return GE_OK;
}

int Pool::shard_stats(int shard, gp_shard_stats *out) {
  std::lock_guard<std::mutex> lk(m_);
  if (!valid_shard(shard)) return GE_ENODEV;
  const Shard &s = shards_[shard];
  out->capacity = s.capacity;
  out->used = s.used;
  out->free = s.free_bytes;
  out->largest_free = s.by_size.empty() ? 0 : std::get<0>(*s.by_size.rbegin());
  out->free_blocks = s.by_size.size();
  out->failures = s.failures;
  out->allocations = s.allocations;
  uint64_t extents = 0;
  for (int32_t i = s.head; i >= 0; i = nodes_[i].next) {
    int32_t p = nodes_[i].prev;
    if (p < 0 || nodes_[p].off + nodes_[p].size != nodes_[i].off) ++extents;
  }
  out->extents = extents;
  out->fragmentation = fragmentation(s);
  return GE_OK;
}

int Pool::alloc_locked(int shard, uint64_t nbytes, uint64_t align, uint64_t *ptr, uint64_t *detail) {
  if (!valid_shard(shard)) return GE_ENODEV;
  if (nbytes == 0 || nbytes > kMaxBytes) return GE_EINVAL;
  if (align == 0) align = granule_;
  if ((align & (align - 1)) || align > kMaxBytes) return GE_EINVAL;
  if (align < granule_) align = granule_;
  uint64_t size = round_up(nbytes, granule_);
  Shard &s = shards_[shard];
  auto fits = [&](int32_t i) { return round_up(base_ + nodes_[i].off, align) - base_ + size <= nodes_[i].off + nodes_[i].size; };
  auto it = s.by_size.lower_bound({size, 0, -1});
  if (policy_ == GP_POLICY_BANDED) {  // lowest address among blocks up to kBand x the request
    auto pick = s.by_size.end();
    int k = 0;
    for (auto j = it; j != s.by_size.end() && std::get<0>(*j) <= size * kBand && k < kBandScan; ++j, ++k)
      if ((pick == s.by_size.end() || std::get<1>(*j) < std::get<1>(*pick)) && fits(std::get<2>(*j))) pick = j;
    if (pick != s.by_size.end()) it = pick;
  }
  for (; it != s.by_size.end(); ++it) {
    int32_t i = std::get<2>(*it);
    if (!fits(i)) continue;
    uint64_t pad = round_up(base_ + nodes_[i].off, align) - base_ - nodes_[i].off;
    s.by_size.erase(it);
    if (pad) {  // the gap before an over-aligned block stays free in its own block
      int32_t f = new_node();
      nodes_[f] = Node{nodes_[i].off, pad, -1, -1, shard, true};
      link_after(s, nodes_[i].prev, f);
      add_free(s, f);
      nodes_[i].off += pad;
      nodes_[i].size -= pad;
    }
    if (nodes_[i].size > size) {
      int32_t r = new_node();
      nodes_[r] = Node{nodes_[i].off + size, nodes_[i].size - size, -1, -1, shard, true};
      link_after(s, i, r);
      add_free(s, r);
      nodes_[i].size = size;
    }
    nodes_[i].free = false;
    live_.emplace(nodes_[i].off, i);
    s.used += size;
    s.free_bytes -= size;
    ++s.allocations;
    *ptr = base_ + nodes_[i].off;
    return GE_OK;
  }
  ++s.failures;
  *detail = s.by_size.empty() ? 0 : std::get<0>(*s.by_size.rbegin());
  return GE_ENOMEM;
}

int Pool::set_policy(int policy) {
  if (policy != GP_POLICY_BEST && policy != GP_POLICY_BANDED) return GE_EINVAL;
  std::lock_guard<std::mutex> lk(m_);
  policy_ = policy;
  return GE_OK;
}

int Pool::alloc(int shard, uint64_t nbytes, uint64_t align, uint64_t *ptr, uint64_t *detail) {
  std::lock_guard<std::mutex> lk(m_);
  return alloc_locked(shard, nbytes, align, ptr, detail);
}

int Pool::free_locked(uint64_t ptr, int *shard) {
  if (ptr < base_ || ptr - base_ >= size_) return GE_ERANGE;
  auto it = live_.find(ptr - base_);
  if (it == live_.end()) return GE_EFREED;
  int32_t i = it->second;
  live_.erase(it);
  Shard &s = shards_[nodes_[i].shard];
  *shard = nodes_[i].shard;
  s.used -= nodes_[i].size;
  s.free_bytes += nodes_[i].size;
  --s.allocations;
  nodes_[i].free = true;
  add_free(s, merge_free(s, i));
  return GE_OK;
}

int Pool::free(uint64_t ptr, int *shard) {
  std::lock_guard<std::mutex> lk(m_);
  return free_locked(ptr, shard);
}

int Pool::lookup(uint64_t ptr, uint64_t *nbytes, int *shard) {
  std::lock_guard<std::mutex> lk(m_);
  if (ptr < base_ || ptr - base_ >= size_) return GE_ERANGE;
  auto it = live_.find(ptr - base_);
  if (it == live_.end()) return GE_EFREED;
  *nbytes = nodes_[it->second].size;
  *shard = nodes_[it->second].shard;
  return GE_OK;
}

int Pool::check(std::string *msg) {
  std::lock_guard<std::mutex> lk(m_);
  return check_locked(msg);
}

int Pool::check_locked(std::string *msg) {
  char buf[256];
  auto fail = [&](const char *fmt, unsigned long long a, unsigned long long b) {
    std::snprintf(buf, sizeof buf, fmt, a, b);
    *msg = buf;
    return GE_EINVAL;
  };
  std::vector<std::pair<uint64_t, uint64_t>> tiles;
  uint64_t live_total = 0;
  for (size_t k = 0; k < shards_.size(); ++k) {
    const Shard &s = shards_[k];
    if (!s.live) {
      if (s.head >= 0 || !s.by_size.empty()) return fail("removed shard %llu still owns blocks (%llu free)", k, s.by_size.size());
      continue;
    }
    uint64_t cap = 0, used = 0, fr = 0, nfree = 0, largest = 0, allocs = 0, steps = 0;
    int32_t prev = -1;
    for (int32_t i = s.head; i >= 0; prev = i, i = nodes_[i].next) {
      if (++steps > nodes_.size()) return fail("shard %llu block list has a cycle (%llu steps)", k, steps);
      const Node &b = nodes_[i];
      if (b.shard != int32_t(k)) return fail("block at offset %llu is listed in shard %llu but owned by another", b.off, k);
      if (b.prev != prev) return fail("shard %llu: broken back link at offset %llu", k, b.off);
      if (b.size == 0 || b.off % granule_ || b.size % granule_)
        return fail("block at offset %llu has size %llu (empty or off the granule)", b.off, b.size);
      if (prev >= 0) {
        const Node &a = nodes_[prev];
        if (a.off + a.size > b.off) return fail("blocks overlap: one ends at %llu, the next starts at %llu", a.off + a.size, b.off);
        if (a.free && b.free && a.off + a.size == b.off)
          return fail("free neighbours not coalesced at offsets %llu and %llu", a.off, b.off);
      }
      cap += b.size;
      if (b.free) {
        fr += b.size;
        ++nfree;
        largest = std::max(largest, b.size);
        if (!s.by_size.count({b.size, b.off, i})) return fail("free block at offset %llu (size %llu) missing from the size index", b.off, b.size);
      } else {
        used += b.size;
        ++allocs;
        auto it = live_.find(b.off);
        if (it == live_.end() || it->second != i) return fail("allocated block at offset %llu (size %llu) not in the live table", b.off, b.size);
      }
      tiles.push_back({b.off, b.size});
    }
    if (s.tail != prev) return fail("shard %llu: tail is not the last block (%llu blocks)", k, steps);
    if (cap != s.capacity) return fail("blocks add up to %llu bytes, capacity says %llu", cap, s.capacity);
    if (used != s.used) return fail("allocated blocks add up to %llu bytes, used says %llu", used, s.used);
    if (fr != s.free_bytes) return fail("free blocks add up to %llu bytes, free says %llu", fr, s.free_bytes);
    if (nfree != s.by_size.size()) return fail("%llu free blocks but %llu in the size index", nfree, s.by_size.size());
    if (allocs != s.allocations) return fail("%llu allocated blocks but the counter says %llu", allocs, s.allocations);
    uint64_t indexed = s.by_size.empty() ? 0 : std::get<0>(*s.by_size.rbegin());
    if (largest != indexed) return fail("largest free block is %llu bytes, the index says %llu", largest, indexed);
    double want = fr ? 1.0 - double(largest) / double(fr) : 0.0;
    if (fragmentation(s) != want) return fail("shard %llu fragmentation off (free %llu)", k, fr);
    live_total += allocs;
  }
  if (live_total != live_.size()) return fail("%llu allocated blocks but %llu in the live table", live_total, live_.size());
  uint64_t prev_end = ~0ull;
  for (auto &r : unassigned_) {
    if (r.second == 0 || r.first == prev_end) return fail("unassigned ranges not coalesced at offset %llu (size %llu)", r.first, r.second);
    prev_end = r.first + r.second;
    tiles.push_back(r);
  }
  std::sort(tiles.begin(), tiles.end());
  uint64_t at = 0;
  for (auto &t : tiles) {
    if (t.first != at) return fail("slab bytes %llu..%llu are lost or claimed twice", std::min(at, t.first), std::max(at, t.first));
    at = t.first + t.second;
  }
  if (at != size_) return fail("blocks cover %llu of %llu slab bytes", at, size_);
  return GE_OK;
}

int Pool::replay(uint64_t n, const int32_t *op, const int32_t *shard, const uint64_t *size, const uint64_t *align,
                 const uint32_t *slot, uint64_t check_every, uint64_t sample_every, gp_replay_result *out,
                 std::string *msg) {
  uint32_t max_slot = 0;
  for (uint64_t i = 0; i < n; ++i) max_slot = std::max(max_slot, slot[i]);
  std::vector<uint64_t> slots(uint64_t(max_slot) + 1, 0);
  *out = gp_replay_result{};
  out->failed_at = -1;
  int rc = GE_OK;
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t &sl = slots[slot[i]];
    if (op[i] == 0) {
      if (sl) {
        *msg = "trace reuses slot " + std::to_string(slot[i]) + " at op " + std::to_string(i) + " while it is live";
        rc = GE_EINVAL;
        break;
      }
      uint64_t ptr = 0, detail = 0;
      int r = alloc(shard[i], size[i], align ? align[i] : 0, &ptr, &detail);
      if (r == GE_ENOMEM) {
        ++out->failures;
      } else if (r != GE_OK) {
        *msg = "alloc at op " + std::to_string(i) + " failed";
        rc = r;
        break;
      } else {
        sl = ptr;
        ++out->allocs;
      }
    } else if (sl) {
      int owner = -1;
      int r = free(sl, &owner);
      if (r != GE_OK) {
        *msg = "free at op " + std::to_string(i) + " failed";
        rc = r;
        break;
      }
      sl = 0;
      ++out->frees;
    }
    if (check_every && (i + 1) % check_every == 0) {
      ++out->checks;
      std::string why;
      if (check(&why) != GE_OK) {
        out->failed_at = int64_t(i);
        *msg = why;
        rc = GE_EINVAL;
        break;
      }
    }
    if (sample_every && (i + 1) % sample_every == 0) {
      std::lock_guard<std::mutex> lk(m_);
      uint64_t used = 0;
      double worst = 0.0;
      for (auto &s : shards_) {
        if (!s.live) continue;
        used += s.used;
        worst = std::max(worst, fragmentation(s));
      }
      out->peak_fragmentation = std::max(out->peak_fragmentation, worst);
      out->mean_fragmentation += worst;
      ++out->samples;
      out->peak_used = std::max(out->peak_used, used);
    }
  }
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out->samples) out->mean_fragmentation /= double(out->samples);
  for (uint64_t p : slots) {
    int owner;
    if (p) free(p, &owner);
  }
  return rc;
}

}  // namespace gp

struct gp_pool {
  gp::Pool pool;
  gp_pool(uint64_t b, uint64_t s, uint64_t g) : pool(b, s, g) {}
};

static void put_msg(const std::string &s, char *msg, int cap) {
  if (!msg || cap <= 0) return;
  std::snprintf(msg, size_t(cap), "%s", s.c_str());
}

extern "C" {

int gp_pool_create(uint64_t base, uint64_t size, uint64_t granule, gp_pool **out) {
  if (!out || base == 0 || size == 0 || granule == 0 || (granule & (granule - 1)) || base % granule ||
      size % granule || size > (1ull << 62) || base + size < base)
    return GE_EINVAL;
  *out = new (std::nothrow) gp_pool(base, size, granule);
  return *out ? GE_OK : GE_ENOMEM;
}
void gp_pool_destroy(gp_pool *p) { delete p; }
uint64_t gp_pool_unassigned(gp_pool *p) { return p->pool.unassigned(); }
int gp_pool_set_policy(gp_pool *p, int policy) { return p->pool.set_policy(policy); }
int gp_shard_add(gp_pool *p, uint64_t capacity, int *shard, uint64_t *detail) {
  return p->pool.shard_add(capacity, shard, detail);
}
int gp_shard_remove(gp_pool *p, int shard, uint64_t *detail) { return p->pool.shard_remove(shard, detail); }
int gp_shard_resize(gp_pool *p, int shard, uint64_t capacity, uint64_t *detail) {
  return p->pool.shard_resize(shard, capacity, detail);
}
int gp_stats(gp_pool *p, int shard, gp_shard_stats *out) { return p->pool.shard_stats(shard, out); }
int gp_alloc(gp_pool *p, int shard, uint64_t nbytes, uint64_t align, uint64_t *ptr, uint64_t *detail) {
  return p->pool.alloc(shard, nbytes, align, ptr, detail);
}
int gp_free(gp_pool *p, uint64_t ptr, int *shard) { return p->pool.free(ptr, shard); }
int gp_lookup(gp_pool *p, uint64_t ptr, uint64_t *nbytes, int *shard) { return p->pool.lookup(ptr, nbytes, shard); }
int gp_check(gp_pool *p, char *msg, int cap) {
  std::string why;
  int rc = p->pool.check(&why);
  put_msg(why, msg, cap);
  return rc;
}
int gp_replay(gp_pool *p, uint64_t n, const int32_t *op, const int32_t *shard, const uint64_t *size,
              const uint64_t *align, const uint32_t *slot, uint64_t check_every, uint64_t sample_every,
              gp_replay_result *out, char *msg, int cap) {
  if (!op || !shard || !size || !slot || !out) return GE_EINVAL;
  std::string why;
  int rc = p->pool.replay(n, op, shard, size, align, slot, check_every, sample_every, out, &why);
  put_msg(why, msg, cap);
  return rc;
}

}  // extern "C"
