// The scheduler shared by both backends: per-(GPU, direction) micro-task queues, chunking, passive
// load balancing over paths (shortest queue, direct first), the pinned staging ring for pageable
// memory, the engine's pools (staging and relay buffers) and stats. engine.cpp wraps it in the C ABI.
// This header declares the Engine; its method bodies live in engine_setup.cpp (start-up, shut-down,
// staging threads, engine pools, knobs), dispatch.cpp (dispatchers, path choice, workers, chunk
// completion, rates) and copies.cpp (starting, running synchronously and waiting for copies).
#pragma once
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "engine_core.hpp"
#include "gpudash_pool.h"

namespace ge {

inline constexpr int kSlots = 32;
inline constexpr uint64_t kSlotBytes = 4ull << 20;
inline constexpr uint64_t kHugeBytes = 2ull << 20;  // a transparent huge page
inline constexpr int kMaxAttempts = 8;
inline constexpr int kPoolHeadroom = 4;  // a relay pool's slab holds 4x what the creation knobs need

inline uint64_t round_page(uint64_t v) { return (v + 4095) & ~uint64_t(4095); }

inline uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

inline double real_now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// GE_OK when the knobs are in range, else GE_EINVAL (engine_setup.cpp).
int validate_knobs(const ge_knobs &k);

// Waiters poll in short naps (poll_until); a 1 us timer slack keeps
// those naps short (the default slack is 50 us).
inline void precise_timers() {
  thread_local bool done = false;
  if (!done) {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    done = true;
  }
}

class Engine {
 public:
  std::unique_ptr<Backend> be;
  double time_scale = 1.0;  // real seconds per backend second
  std::mutex knob_m;
  ge_knobs knobs{};
  std::vector<std::unique_ptr<Group>> groups;  // index gpu * 2 + dir
  std::vector<std::unique_ptr<Path>> paths;
  std::atomic<bool> stopping{false};  // set under every group lock by the destructor
  // Callers inside a call that can block on a copy (ge_wait, ge_finish, ge_copy_sync): the destructor
  // finishes every copy, then waits for them to leave before it frees anything.
  std::atomic<int> blocked_callers{0};
  static constexpr std::chrono::milliseconds kLeaveNap{1};
  int ngpu = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> link_h2d, link_d2h;

  std::mutex copies_m;
  std::unordered_map<uint64_t, std::shared_ptr<Copy>> copies;
  uint64_t next_id = 1;

  // staging threads: memcpy between pageable user memory and pinned slots
  std::mutex st_m;
  std::condition_variable st_cv;
  std::deque<std::function<void()>> st_tasks;
  std::vector<std::thread> st_threads;
  int st_target = 0, st_alive = 0;
  bool st_stop = false;

  // The engine's own pools (gpudash_pool.h): the staging ring's slots are blocks of the pinned host
  // pool's "staging" shard, relay buffers blocks of the via GPU's device pool "relay" shard. A chunk
  // takes its block when it is issued and gives it back when it lands, so the shard stats show what
  // copies hold now; allocation is one pool call per chunk (a lock and a tree look-up), no driver call.
  struct EnginePool {
    gp_pool *pool = nullptr;  // null: that GPU carries no relay path
    int shard = -1;
    uint64_t slab = 0, size = 0, granule = 0;
    uint64_t floor = 0;       // capacity the engine needs: the largest any knob setting asked for
  };
  EnginePool host_pool;               // "which" -1 in the C ABI
  std::vector<EnginePool> dev_pools;  // per GPU
  std::atomic<int> staged_live{0};    // staging blocks held (at most kSlots: the ring's depth)

  // ---- set-up and shut-down (engine_setup.cpp) ---------------------------------------------
  int init(Backend *b, const ge_knobs &k, double scale);
  void add_path(Group &g, int via);
  ~Engine();

  // ---- staging threads (engine_setup.cpp) --------------------------------------------------
  void resize_staging(int n);
  void staging_loop();
  void submit_staging(std::function<void()> f);

  // ---- engine pools (engine_setup.cpp) -----------------------------------------------------
  EnginePool &pool_of(int which) { return which < 0 ? host_pool : dev_pools[which]; }

  // Under one knob setting every block of a shard has the same size, so a shard never fragments: a
  // staging slot holds the largest staged chunk (at most kSlotBytes), a relay buffer the largest chunk.
  static uint64_t slot_bytes(const ge_knobs &k) {
    return round_page(std::min(std::max(k.h2d_chunk_bytes, k.d2h_chunk_bytes), kSlotBytes));
  }
  static uint64_t relay_bytes(const ge_knobs &k) { return round_page(std::max(k.h2d_chunk_bytes, k.d2h_chunk_bytes)); }

  // Shard bytes pool `which` needs under knobs k: the ring's slots, or `outstanding` buffers for every
  // relay path through GPU `which` (with fewer, a relay chunk waits for a block and the direct path
  // may take it meanwhile).
  uint64_t need(const ge_knobs &k, int which) const;

  int make_pool(int which, uint64_t slab);

  // What pool `which` must hold at the least: one chunk on every relay path (all the ring's slots).
  uint64_t need_min(ge_knobs k, int which) const {
    k.outstanding = 1;
    return need(k, which);
  }

  // New knobs, with every engine shard grown to what they need (at most its whole pool); GE_ENOMEM and
  // nothing changed when a pool cannot hold need_min. Shards never shrink here: a copy in flight may
  // still use the older sizes.
  int set_knobs(const ge_knobs &k);

  // A staging slot for a chunk of copy c, or 0 while the ring is at its depth or the shard has no
  // room (the caller waits; a slot that did not fit counts as a failure in the shard's stats).
  uint64_t try_stage(const Copy &c);
  void release_stage(uint64_t ptr);

  // Relay buffers: blocks of the via GPU's "relay" shard.
  int relay_get(int via, const Copy &c, uint64_t *ptr);
  void relay_put(int via, uint64_t ptr);

  // ---- chunks: dispatch, paths, completion (dispatch.cpp) ----------------------------------
  void finish_chunk(Chunk *ch, int rc);
  void finish_copy(Copy &c);
  Path *pick_path(Group &g, const Copy &c, bool *all_failed);
  Chunk *make_chunk(const std::shared_ptr<Copy> &c, uint64_t idx);
  void dispatch_loop(Group &g);

  // Issue a chunk on a path (group lock held) and hand it to the path's worker.
  int issue_on(Path &p, Chunk &ch);

  // Books `len` bytes landed on path p: its counters, its host link's, and a mark for its recent rate.
  void count_landed(Path &p, uint64_t len);
  double rate(Path &p);

  // Waits for a chunk the caller took off the path's queue, then settles it (group lock not held).
  void run_chunk(Path &p, Chunk *ch, std::unique_lock<std::mutex> &lk);

  // Book a completed (or failed) chunk: stats, retry on another path, staging drain, copy completion.
  // Called with the group lock held; returns with it held.
  void settle(Path &p, Chunk *ch, int rc, std::unique_lock<std::mutex> &lk);

  void worker_loop(Path &p);

  // ---- copies (copies.cpp) -----------------------------------------------------------------
  // Shift of a staged D2H copy's chunk grid so chunk boundaries fall on 2 MiB boundaries of the
  // destination, and huge-page advice over a staged D2H destination (see copies.cpp).
  static uint64_t huge_skew(uint64_t dst, uint64_t chunk);
  static void advise_huge(uint64_t addr, uint64_t len);

  // A waiter that finds its copy's only chunk still queued completes it itself: one thread polls the
  // event instead of a worker polling and then waking the waiter (a futex wake-up costs tens of us).
  void wait_inline(Copy &c);

  // Starts a copy: a one-chunk copy on an idle group is issued from the caller's thread (no dispatcher
  // hop) and handed to the path's worker, unless its waiter completes it first; others are queued.
  int start_copy(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                 std::shared_ptr<Copy> *out);

  // Registers a started copy under a new handle (ge_copy); synchronous copies never need one.
  uint64_t add_handle(const std::shared_ptr<Copy> &c);

  // GE_OK when the copy is done, GE_ETIMEOUT while it runs (timeout_s < 0: wait forever), else its error.
  int wait(Copy &c, double timeout_s);

  // Chunks completed and paths used by a copy.
  void progress(Copy &c, uint64_t *chunks, int *paths_used);

  // A whole copy on the caller's thread: one driver copy and one stream sync when it can (see
  // copy_now), else start it and wait (a one-chunk copy is then completed inline by wait()).
  int copy_sync(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                uint64_t *chunks, int *paths_used);

  // The synchronous fast path: a single-path direct copy while its group is idle and its direct path
  // has nothing in flight is issued and completed by the backend on this thread, with no Copy, no
  // chunk queue, no event and no other thread woken (a small copy then costs what the driver calls
  // cost). kNotNow: not eligible (or it failed while relays could take it): use the general path.
  static constexpr int kNotNow = 1;
  int copy_now(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream);

  std::shared_ptr<Copy> find(uint64_t h);
};

}  // namespace ge
