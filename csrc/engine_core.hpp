// Internal types shared by the scheduler (scheduler.hpp and its engine_setup.cpp, dispatch.cpp, copies.cpp)
// and the backends (backend_sim.cpp, backend_cuda.cpp).
#pragma once

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpudash_engine.h"

namespace ge {

// CPU time of the calling thread (what each path and the staging threads are charged).
inline uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// Marks kept per path for its recent rate (a ring; see Engine::count_landed and Engine::rate).
constexpr int kRateMarks = 16;

// Below this size a synchronous copy spins in the driver's stream sync all the way (CPU time == wall
// time); from it on, the CUDA backend naps through most of the copy instead.
constexpr uint64_t kSpinBytes = 8ull << 20;

struct Path;
struct Group;

// ---- what only one backend uses, fenced off from the shared fields -----------------------------
// A backend's own state for one copy, made by the backend (the CUDA backend's place in the caller's
// stream: stream_begin) and freed with the copy.
struct CopyState {
  virtual ~CopyState() = default;
};

// A chunk lives under one engine, so one backend: the union holds that backend's state only
// (zeroed with the chunk; the sim member is the one initialised).
struct SimChunk {
  double done_t;   // when the link model says the chunk lands (sim seconds)
};
struct CudaChunk {
  void *event;     // completion event, recorded on the path's stream after the chunk's copies
};
union ChunkBackendState {
  SimChunk sim;
  CudaChunk cuda;
};

// One copy: its chunks are spread over the paths of its (gpu, direction) group.
struct Copy {
  uint64_t id = 0;
  int dir = GE_H2D;
  int gpu = 0;
  uint64_t dst = 0, src = 0, nbytes = 0;
  int host_mode = GE_HOST_DIRECT;
  ge_knobs knobs{};          // the settings the copy started with
  uint64_t chunk = 0;        // chunk size in use
  uint64_t skew = 0;         // the chunk grid starts `skew` bytes before the copy (huge_skew)
  uint64_t nchunks = 0;
  bool single_path = false;  // below the fallback threshold (or one path only): direct path alone
  uint64_t stream = 0;       // user stream (cuda; the sim refuses one)
  std::unique_ptr<CopyState> medium;  // the backend's own state for this copy, if it keeps any
  // progress (guarded by the group mutex, except the atomics)
  uint64_t next_chunk = 0;   // next chunk index to produce
  std::atomic<uint64_t> remaining{0};
  std::atomic<uint64_t> chunks_done{0};
  std::vector<char> path_used;    // guarded by the group mutex
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  std::atomic<bool> landed{false};  // == finished, readable without the lock (polling waiters)
  Path *sole_path = nullptr;        // one-chunk copies: the path holding the chunk (group lock)
  int status = GE_OK;
};

// A unit of work on one path.
struct Chunk {
  std::shared_ptr<Copy> copy;
  uint64_t off = 0, len = 0;
  uint64_t host = 0;     // host address the path reads/writes (user buffer or staging slot)
  uint64_t dev = 0;      // device address
  uint64_t stage = 0;    // staging slot (a block of the engine's pinned "staging" shard), 0 if none
  uint64_t relay = 0;    // relay staging buffer (a block of the via GPU's "relay" shard), 0 if none
  double issue_t = 0;    // steady-clock seconds when issued
  int attempts = 0;
  ChunkBackendState be{};
};

// A path's backend state (its stream, its fault switch) lives in the backend, by path id (prepare_path).
struct Path {
  int id = 0, gpu = 0, via = 0, dir = 0;
  Group *group = nullptr;
  std::deque<Chunk *> q;  // issued, waiting for completion (guarded by group->m)
  int depth = 0;          // chunks issued and not completed (guarded by group->m)
  bool failed = false;    // guarded by group->m
  std::atomic<uint64_t> bytes{0}, chunks{0}, cpu_ns{0};
  // recent rate: ring of (clock, bytes) marks, guarded by rate_m
  std::mutex rate_m;
  double mark_t[kRateMarks] = {0};
  uint64_t mark_b[kRateMarks] = {0};
  int mark_n = 0, mark_i = 0;
  std::thread worker;
  std::condition_variable cv;
};

// All paths that can write into (read from) one GPU in one direction, and the dispatcher feeding them.
struct Group {
  int gpu = 0, dir = 0;
  std::mutex m;
  std::condition_variable cv;  // dispatcher wakes on: new copy, path room, chunk ready, slot free
  std::deque<std::shared_ptr<Copy>> copies;
  std::deque<Chunk *> ready;     // staged H2D chunks filled by the staging threads
  std::deque<Chunk *> retry;     // chunks whose path failed
  std::vector<Path *> paths;     // paths[0] is the direct path
  std::thread dispatcher;
};

class Engine;

// What differs between the sim and the CUDA data planes: the one interface the scheduler and the C ABI
// use. Each backend keeps its own state (per GPU, per path) private; what only one backend has (the sim's
// links, tracked memory and path faults: backend_sim.hpp) is not part of it.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual int init(Engine &e) = 0;
  virtual int num_gpus() const = 0;
  virtual std::string device_name(int gpu) = 0;
  virtual double peer_gbps(int a, int b) = 0;  // 0: none
  virtual double now() = 0;                     // backend clock, seconds
  virtual void thread_init(int gpu) { (void)gpu; }
  // Called once for each path, in path-id order, before any copy; release_path pairs with it at shut-down.
  virtual int prepare_path(Path &p) = 0;
  virtual void release_path(Path &p) { (void)p; }
  // issue: called by the dispatcher under the group lock; complete: by the path's worker, no lock.
  virtual int issue(Path &p, Chunk &c) = 0;
  virtual int complete(Path &p, Chunk &c) = 0;
  // A single-path copy issued and completed on the caller's thread (synchronous copies on an idle
  // path); `stream` is the caller's stream (cuda), 0 for none. Called without the group lock.
  virtual int copy_now(Path &p, Chunk &c, uint64_t stream) {
    if (stream) return GE_ENOTSUP;
    int rc = issue(p, c);
    return rc ? rc : complete(p, c);
  }
  virtual int alloc_device(int gpu, uint64_t n, uint64_t *ptr) = 0;
  virtual int free_device(uint64_t ptr) = 0;
  virtual int alloc_host(uint64_t n, uint64_t *ptr) = 0;
  virtual int free_host(uint64_t ptr) = 0;
  virtual int classify(uint64_t ptr, int *kind, int *gpu, uint64_t *avail) = 0;
  virtual int host_register(uint64_t ptr, uint64_t n) = 0;
  virtual int host_unregister(uint64_t ptr) = 0;
  virtual int stream_begin(Copy &c) { return c.stream ? GE_ENOTSUP : GE_OK; }
  virtual void stream_end(Copy &c) { (void)c; }
  virtual void link_gbps(int gpu, double *h2d, double *d2h) { (void)gpu; *h2d = 0; *d2h = 0; }
};

// Polls done() until it holds: yields for the first `spin_s`, then naps of elapsed/`frac` (between
// 2 us and `max_nap_s`); gives up (returns false) after `give_up_s` so the caller can block instead.
// Short copies finish inside the spin; long ones cost one wake-up per nap and land at most one nap late,
// which is far less than the driver's blocking-sync wake-up.
template <class F>
bool poll_until(F done, double spin_s, double frac, double max_nap_s, double give_up_s) {
  using namespace std::chrono;
  auto t0 = steady_clock::now();
  for (;;) {
    if (done()) return true;
    double el = duration<double>(steady_clock::now() - t0).count();
    if (el > give_up_s) return false;
    if (el < spin_s) {
      std::this_thread::yield();
    } else {
      double nap = std::min(std::max(el / frac, 2e-6), max_nap_s);
      std::this_thread::sleep_for(duration<double>(nap));
    }
  }
}

Backend *make_cuda_backend();
const char *cuda_error_name(int cuda_result);  // nullptr until libcuda is loaded

}  // namespace ge
