// Sharded best-fit pool over one slab (see gpudash_pool.h). Addresses only: no byte is touched.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpudash_engine.h"
#include "gpudash_pool.h"

namespace gp {

// A block of a shard: free or allocated. Blocks of one shard form an address-ordered list.
struct Node {
  uint64_t off = 0, size = 0;
  int32_t prev = -1, next = -1;
  int32_t shard = -1;
  bool free = false;
};

struct Shard {
  bool live = false;
  uint64_t capacity = 0, used = 0, free_bytes = 0, failures = 0, allocations = 0;
  int32_t head = -1, tail = -1;                      // lowest / highest address block
  std::set<std::tuple<uint64_t, uint64_t, int32_t>> by_size;  // free blocks: (size, offset, node); ties go low
};

class Pool {
 public:
  Pool(uint64_t base, uint64_t size, uint64_t granule);

  int shard_add(uint64_t capacity, int *shard, uint64_t *detail);
  int shard_remove(int shard, uint64_t *detail);
  int shard_resize(int shard, uint64_t capacity, uint64_t *detail);
  int shard_stats(int shard, gp_shard_stats *out);
  int alloc(int shard, uint64_t nbytes, uint64_t align, uint64_t *ptr, uint64_t *detail);
  int free(uint64_t ptr, int *shard);
  int lookup(uint64_t ptr, uint64_t *nbytes, int *shard);
  int check(std::string *msg);
  uint64_t unassigned();
  int set_policy(int policy);
  int replay(uint64_t n, const int32_t *op, const int32_t *shard, const uint64_t *size, const uint64_t *align,
             const uint32_t *slot, uint64_t check_every, uint64_t sample_every, gp_replay_result *out,
             std::string *msg);

 private:
  // unlocked versions (callers hold m_)
  int alloc_locked(int shard, uint64_t nbytes, uint64_t align, uint64_t *ptr, uint64_t *detail);
  int free_locked(uint64_t ptr, int *shard);
  int check_locked(std::string *msg);
  bool valid_shard(int s) const { return s >= 0 && s < int(shards_.size()) && shards_[s].live; }
  int32_t new_node();
  void drop_node(int32_t i);
  void link_after(Shard &s, int32_t after, int32_t i);  // after == -1: at the head
  void unlink(Shard &s, int32_t i);
  void add_free(Shard &s, int32_t i) { s.by_size.insert({nodes_[i].size, nodes_[i].off, i}); }
  void del_free(Shard &s, int32_t i) { s.by_size.erase({nodes_[i].size, nodes_[i].off, i}); }
  int32_t merge_free(Shard &s, int32_t i);                // coalesce free node i with touching free neighbours
  void give_range(Shard &s, uint64_t off, uint64_t size);  // slab range joins the shard as free space
  // Carves `need` bytes of unassigned slab (starting at prefer_off if free there, else one range that
  // fits, else pieces in address order). The caller checked that enough is unassigned.
  void take_unassigned(uint64_t need, uint64_t prefer_off, std::vector<std::pair<uint64_t, uint64_t>> *out);
  void return_unassigned(uint64_t off, uint64_t size);
  uint64_t tail_free(const Shard &s) const;  // free bytes at the shard's end (what a shrink can give back)
  double fragmentation(const Shard &s) const;

  std::mutex m_;
  int policy_ = GP_POLICY_BEST;
  uint64_t base_, size_, granule_;
  std::vector<Node> nodes_;
  std::vector<int32_t> spare_;                        // recycled node indices
  std::vector<Shard> shards_;
  std::unordered_map<uint64_t, int32_t> live_;        // offset of an allocation -> node
  std::map<uint64_t, uint64_t> unassigned_;           // slab ranges no shard owns: offset -> size
};

}  // namespace gp
