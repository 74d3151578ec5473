// The scheduler shared by both backends: per-(GPU, direction) micro-task queues, chunking, passive
// load balancing over paths (shortest queue, direct first), the pinned staging ring for pageable
// memory and stats. engine.cpp wraps it in the C ABI; csrc/README.md tells the threading model.
// This header declares the Engine; its method bodies live in engine_setup.cpp (start-up, shut-down,
// knobs, the ABI's reads), dispatch.cpp (dispatchers, path choice, workers, chunk completion, rates)
// and copies.cpp (starting, running synchronously and waiting for copies). Its staging threads are
// a StagingThreads (staging.hpp), its pools an EnginePools (engine_pools.hpp).
#pragma once
#include <stdio.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "engine_core.hpp"
#include "engine_pools.hpp"
#include "staging.hpp"

namespace ge {

inline constexpr uint64_t kHugeBytes = 2ull << 20;  // a transparent huge page
inline constexpr int kMaxAttempts = 8;              // a chunk fails its copy after this many path failures

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

// Names the calling thread (at most 15 characters), so top -H, py-spy and a profile's per-thread table
// tell the engine's threads apart inside the host process.
inline void name_thread(const char *fmt, int a = 0, int b = 0) {
  char name[16];
  snprintf(name, sizeof name, fmt, a, b);
  prctl(PR_SET_NAME, name, 0, 0, 0);
}

class Engine {
 public:
  Engine() = default;
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // ---- life (engine_setup.cpp) ---------------------------------------------------------------
  // Takes the backend (owned from now on, even on failure) and starts every thread.
  int init(Backend *b, const ge_knobs &k, double scale);
  // Stops: queued copies fail with GE_ECLOSED, chunks on paths land, blocked callers leave; then frees.
  ~Engine();

  // Counts a caller inside a call that may block on a copy (ge_wait, ge_finish, ge_copy_sync), so the
  // destructor frees nothing until it has left: construct on entry, destroyed on return.
  class BlockingCall {
   public:
    explicit BlockingCall(Engine &e) : e_(e) { e_.blocked_callers_.fetch_add(1); }
    ~BlockingCall() { e_.blocked_callers_.fetch_sub(1); }
    BlockingCall(const BlockingCall &) = delete;
    BlockingCall &operator=(const BlockingCall &) = delete;

   private:
    Engine &e_;
  };

  // ---- what the C ABI reads and sets (engine_setup.cpp) --------------------------------------
  int num_gpus() const { return ngpu_; }
  int num_paths() const { return int(paths_.size()); }
  Backend &backend() { return *be_; }  // memory and pointer look-ups go straight to it
  ge_knobs knobs();
  // Validated knobs k: pools grown for them and the staging threads resized (GE_ENOMEM: unchanged).
  int set_knobs(const ge_knobs &k);
  PoolView pool(int which) { return pools_.view(which); }
  uint64_t pool_need(const ge_knobs &k, int which) const { return pools_.need_min(k, which); }
  void path_stats(int i, ge_path_stats *out);
  void link_stats(int gpu, ge_link_stats *out);
  // The id of path (gpu, via, direction), -1 for none; heal_path clears its failed flag, so the
  // dispatcher uses it again (after the sim stops failing it: ge_sim_fail_path).
  int path_id(int gpu, int via, int dir) const;
  void heal_path(int id);

  // ---- copies (copies.cpp) -------------------------------------------------------------------
  // Starts a copy: a one-chunk copy on an idle group is issued from the caller's thread (no dispatcher
  // hop) and handed to the path's worker, unless its waiter completes it first; others are queued.
  // GE_ECLOSED once the engine is stopping.
  int start_copy(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                 std::shared_ptr<Copy> *out);

  // Registers a started copy under a new handle (ge_copy); synchronous copies never need one.
  // Pair with release().
  uint64_t add_handle(const std::shared_ptr<Copy> &c);
  std::shared_ptr<Copy> find(uint64_t h);
  int release(uint64_t h);

  // GE_OK when the copy is done, GE_ETIMEOUT while it runs (timeout_s < 0: wait forever), else its error.
  int wait(Copy &c, double timeout_s);

  // Chunks completed and paths used by a copy.
  void progress(Copy &c, uint64_t *chunks, int *paths_used);

  // A whole copy on the caller's thread: one driver copy and one stream sync when it can (see
  // copy_now), else start it and wait (a one-chunk copy is then completed inline by wait()).
  int copy_sync(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                uint64_t *chunks, int *paths_used);

 private:
  // ---- set-up (engine_setup.cpp) -------------------------------------------------------------
  void add_path(Group &g, int via);
  void stop_threads();

  // ---- staging slots (engine_setup.cpp) ------------------------------------------------------
  // A slot for a chunk of copy c, or 0 while the ring is full (EnginePools::take_slot). Pair with
  // release_stage(), which also wakes the dispatchers waiting for a slot.
  uint64_t try_stage(const Copy &c) { return pools_.take_slot(c.knobs); }
  void release_stage(uint64_t ptr);

  // ---- chunks: dispatch, paths, completion (dispatch.cpp) ------------------------------------
  // What a dispatcher step found: a chunk waiting in retry or ready (and that queue), or the front copy.
  struct Next {
    Chunk *chunk = nullptr;
    std::deque<Chunk *> *from = nullptr;
    std::shared_ptr<Copy> copy;
  };
  // How a dispatcher step ended: it moved something (look again), found nothing to do (sleep until
  // woken), or found no room for the next chunk (a path, a staging slot or a relay block; nap).
  enum class Step { kMoved, kIdle, kNoRoom };

  void dispatch_loop(Group &g);
  Step dispatch_step(Group &g, std::unique_lock<std::mutex> &lk);
  Next next_work(Group &g);
  Step stage_h2d(Group &g, const std::shared_ptr<Copy> &c);
  Chunk *take_chunk(Next &n);
  void fail_next(Next &n, std::unique_lock<std::mutex> &lk);
  Step issue_chunk(Group &g, Path &p, Chunk *ch);
  void fail_unissued(Group &g, std::unique_lock<std::mutex> &lk);

  void finish_chunk(Chunk *ch, int rc);
  void finish_copy(Copy &c);
  Path *pick_path(Group &g, const Copy &c, bool *all_failed);
  Chunk *make_chunk(const std::shared_ptr<Copy> &c, uint64_t idx);

  // Issue a chunk on a path (group lock held) and hand it to the path's worker.
  int issue_on(Path &p, Chunk &ch);

  // Books `len` bytes landed on path p: its counters, its host link's, and a mark for its recent rate.
  void count_landed(Path &p, uint64_t len);
  double rate(Path &p);

  // Waits for a chunk the caller took off the path's queue, then settles it (group lock not held;
  // taken before settling, held on return).
  void run_chunk(Path &p, Chunk *ch, std::unique_lock<std::mutex> &lk);

  // Book a completed (or failed) chunk: stats, retry on another path, staging drain, copy completion.
  // Called with the group lock held; returns with it held.
  void settle(Path &p, Chunk *ch, int rc, std::unique_lock<std::mutex> &lk);

  // Copies a landed staged D2H chunk from its slot into its copy's destination on the staging threads,
  // then frees the slot and runs `then` (the chunk is still alive there: settle finishes it, stage_now
  // deletes it).
  void drain_chunk(Path &p, Chunk *ch, std::function<void()> then);

  void worker_loop(Path &p);

  // ---- copies (copies.cpp) -------------------------------------------------------------------
  // Shift of a staged D2H copy's chunk grid so chunk boundaries fall on 2 MiB boundaries of the
  // destination, and huge-page advice over a staged D2H destination (see copies.cpp).
  static uint64_t huge_skew(uint64_t dst, uint64_t chunk);
  static void advise_huge(uint64_t addr, uint64_t len);
  // Whether the page holding addr is resident (mincore): user memory already written, not fresh.
  static bool faulted_in(uint64_t addr);
  // How a staged D2H chunk is drained into its destination [dst, dst + len): whether that memory is
  // already faulted in decides.
  static StagingThreads::CopyMode drain_mode(uint64_t dst, uint64_t len);

  // A waiter that finds its copy's only chunk still queued completes it itself: one thread polls the
  // event instead of a worker polling and then waking the waiter (a futex wake-up costs tens of us).
  void wait_inline(Copy &c);

  // The synchronous fast path: a single-path direct copy while its group is idle and its direct path
  // has nothing in flight is issued and completed by the backend on this thread, with no Copy, no
  // chunk queue, no event and no other thread woken (a small copy then costs what the driver calls
  // cost). kNotNow: not eligible (or it failed while relays could take it): use the general path.
  static constexpr int kNotNow = 1;
  int copy_now(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream);

  // The synchronous staged path: a single-path staged copy while its group is idle runs on the caller's
  // thread, with no dispatcher or path worker woken: each hop between threads costs tens of
  // microseconds per copy. llama.cpp saves its prompt cache as one synchronous D2H copy per tensor, and
  // PyTorch's .to("cuda") of a pageable tensor is one synchronous H2D copy. Sets *chunks; kNotNow as
  // copy_now.
  int stage_now(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                uint64_t *chunks);
  // Holds group g's direct path for a copy run on the caller's thread (copy_now, stage_now): only while
  // nothing of the group is queued and the path has nothing in flight (false: not now). The dispatcher
  // sees the path busy meanwhile. drop_direct lets it go after the copy ended with rc, and answers what
  // the synchronous call returns (kNotNow: a failure that relays may retry).
  bool hold_direct(Group &g);
  int drop_direct(Group &g, int rc);
  // stage_now's D2H loop over the chunks of c on path p: every chunk the ring has a slot for goes on
  // the path's stream, each landed chunk is handed to the staging threads to drain. Returns the first
  // error (what is in flight lands first), after every drained chunk has freed its slot.
  int stage_d2h_here(Path &p, const std::shared_ptr<Copy> &c);
  // stage_now's H2D loop: every chunk the ring has a slot for is handed to the staging threads to fill,
  // and this thread copies queued pieces too; filled chunks go on the path's stream in order, and the
  // oldest in flight is landed when its slot is needed or nothing else is left to do. Returns the first
  // error, after every fill has finished and every chunk on the stream has landed.
  struct Fill;
  int stage_h2d_here(Path &p, const std::shared_ptr<Copy> &c);
  // Completes the oldest chunk of `inflight` (Backend::complete), books it and frees its slot.
  int land_oldest(Path &p, std::deque<Chunk *> &inflight);
  // How staged H2D chunks are filled: pieces with streaming stores (the slot is read only by the copy
  // engine, so its lines need no read-for-ownership and stay out of the caches).
  static constexpr StagingThreads::CopyMode kFillMode = StagingThreads::CopyMode::kPiecesStreaming;
  // A copy's plan (knobs, chunk size, huge-page skew, chunks) before anything runs (start_copy, stage_now).
  std::shared_ptr<Copy> new_copy(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode,
                                 uint64_t stream);

  Group &group_of(int gpu, int dir) { return *groups_[size_t(gpu) * 2 + size_t(dir)]; }

  std::unique_ptr<Backend> be_;
  double time_scale_ = 1.0;  // real seconds per backend second
  int ngpu_ = 0;
  std::mutex knob_m_;
  ge_knobs knobs_{};                             // guarded by knob_m_
  std::vector<std::unique_ptr<Group>> groups_;   // index gpu * 2 + dir; fixed after init
  std::vector<std::unique_ptr<Path>> paths_;     // by path id; fixed after init
  std::atomic<bool> stopping_{false};            // set under every group lock by the destructor
  std::atomic<int> blocked_callers_{0};          // see BlockingCall
  static constexpr std::chrono::milliseconds kLeaveNap{1};  // the destructor's look for blocked callers
  std::unique_ptr<std::atomic<uint64_t>[]> link_h2d_, link_d2h_;  // bytes over each GPU's host link

  std::mutex copies_m_;
  std::unordered_map<uint64_t, std::shared_ptr<Copy>> copies_;  // by handle; guarded by copies_m_
  uint64_t next_id_ = 1;                                        // guarded by copies_m_

  StagingThreads staging_;
  EnginePools pools_;
};

}  // namespace ge
