// Copies as the C ABI sees them: starting one (ge_copy), running one on the caller's thread
// (ge_copy_sync, with its synchronous fast path), waiting for one, its progress and its handle. The
// Engine class is in scheduler.hpp; the chunks themselves run in dispatch.cpp.
#include <sys/mman.h>

#include "scheduler.hpp"

namespace ge {

// Shift of a staged D2H copy's chunk grid (the first chunk is `chunk - skew` bytes) that puts chunk
// boundaries on 2 MiB boundaries of the destination (or on multiples of a chunk that divides 2 MiB):
// then no two staging threads fault the same fresh huge page, where one would wait while the other
// has the kernel zero it.
uint64_t Engine::huge_skew(uint64_t dst, uint64_t chunk) {
  uint64_t a = chunk % kHugeBytes == 0 ? kHugeBytes : kHugeBytes % chunk == 0 ? chunk : 0;
  uint64_t first = a ? (a - dst % a) % a : 0;
  return first ? chunk - first : 0;
}

// A staged D2H destination is usually fresh memory: ask for huge pages over all of it at once, so the
// staging threads' memcpy faults (and the kernel zeroes) 2 MiB pages, not 4 KiB ones. Advice only.
// (Faulting each chunk ahead with MADV_POPULATE_WRITE was slower on the H200 host: 20.8 vs 27 GB/s
// with 12 threads, and it collapsed with 16.)
void Engine::advise_huge(uint64_t addr, uint64_t len) {
  uint64_t lo = (addr + kHugeBytes - 1) & ~(kHugeBytes - 1), hi = (addr + len) & ~(kHugeBytes - 1);
  if (hi > lo) madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_HUGEPAGE);
}

bool Engine::faulted_in(uint64_t addr) {
  unsigned char in_core = 0;
  return mincore(reinterpret_cast<void *>(addr & ~(kPageBytes - 1)), kPageBytes, &in_core) == 0 && (in_core & 1);
}

// Measured on the H200 host (64 copies of 32 MiB, median of 7 interleaved rounds, two processes):
// into memory already faulted in (llama.cpp zero-fills its state buffer first) pieces with streaming
// stores drain at 26.7 and 40.7 GB/s against 20.9 and 30.4 for one plain memcpy a chunk; into fresh
// memory (PyTorch's .cpu()) they fall to 9.3 and 11.2 against 14.1 and 19.1: the threads queue on
// one huge page's fault, and the kernel has just zeroed the page into the caches that plain stores
// then hit. So the middle page of the chunk's destination decides (it is touched by no other chunk).
StagingThreads::CopyMode Engine::drain_mode(uint64_t dst, uint64_t len) {
  return faulted_in(dst + len / 2) ? StagingThreads::CopyMode::kPiecesStreaming : StagingThreads::CopyMode::kWhole;
}

// A waiter that finds its copy's only chunk still queued completes it itself: one thread polls the
// event instead of a worker polling and then waking the waiter (a futex wake-up costs tens of us).
void Engine::wait_inline(Copy &c) {
  Group &g = group_of(c.gpu, c.dir);
  std::unique_lock<std::mutex> lk(g.m);
  Path *p = c.sole_path;
  if (!p || c.finished) return;
  for (auto it = p->q.begin(); it != p->q.end(); ++it) {
    if ((*it)->copy.get() != &c) continue;
    Chunk *ch = *it;
    p->q.erase(it);
    c.sole_path = nullptr;
    lk.unlock();
    run_chunk(*p, ch, lk);
    return;
  }
}

std::shared_ptr<Copy> Engine::new_copy(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode,
                                       uint64_t stream) {
  bool direct_only = (host_mode & GE_COPY_DIRECT_ONLY) != 0;
  host_mode &= ~GE_COPY_DIRECT_ONLY;
  auto c = std::make_shared<Copy>();
  {
    std::lock_guard<std::mutex> lk(knob_m_);
    c->knobs = knobs_;
  }
  c->dir = dir;
  c->gpu = gpu;
  c->dst = dst;
  c->src = src;
  c->nbytes = n;
  c->host_mode = host_mode;
  c->stream = stream;
  Group &g = group_of(gpu, dir);
  uint64_t fallback = dir == GE_H2D ? c->knobs.h2d_fallback_bytes : c->knobs.d2h_fallback_bytes;
  c->chunk = dir == GE_H2D ? c->knobs.h2d_chunk_bytes : c->knobs.d2h_chunk_bytes;
  c->single_path = direct_only || n < fallback || g.paths.size() == 1;
  // A staged D2H chunk is at most one huge page: each staging task then faults (and has the kernel
  // zero) one fresh page of its own; on the H200 host 2 MiB beat 1 and 4 MiB (32 vs 25 and 28 GB/s).
  if (host_mode == GE_HOST_STAGED) c->chunk = std::min(c->chunk, dir == GE_D2H ? kHugeBytes : kSlotBytes);
  else if (c->single_path) c->chunk = std::max<uint64_t>(n, 1);
  if (host_mode == GE_HOST_STAGED && dir == GE_D2H) c->skew = huge_skew(dst, c->chunk);
  c->nchunks = n ? (n + c->skew + c->chunk - 1) / c->chunk : 0;
  c->remaining = c->nchunks;
  c->path_used.assign(paths_.size(), 0);
  return c;
}

int Engine::start_copy(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                       std::shared_ptr<Copy> *out) {
  if (stopping_) return GE_ECLOSED;
  if (dir != GE_H2D && dir != GE_D2H) return GE_EINVAL;
  int mode = host_mode & ~GE_COPY_DIRECT_ONLY;
  if (mode != GE_HOST_DIRECT && mode != GE_HOST_STAGED) return GE_EINVAL;
  if (gpu < 0 || gpu >= ngpu_) return GE_ENODEV;
  if (!dst || !src) return GE_EINVAL;
  auto c = new_copy(dir, gpu, dst, src, n, host_mode, stream);
  host_mode = mode;
  Group &g = group_of(gpu, dir);
  int rc = be_->stream_begin(*c);
  if (rc) return rc;
  *out = c;
  if (c->nchunks == 0) {
    finish_copy(*c);
    return GE_OK;
  }
  // memory already faulted in keeps its pages (advice there would only set khugepaged collapsing them)
  if (host_mode == GE_HOST_STAGED && dir == GE_D2H && !faulted_in(dst + n / 2)) advise_huge(dst, n);
  {
    std::unique_lock<std::mutex> lk(g.m);
    if (stopping_) {  // read under the group lock: the dispatcher and the workers may be gone already
      lk.unlock();
      c->status = GE_ECLOSED;
      finish_copy(*c);
      return GE_ECLOSED;
    }
    Path *direct = g.paths[0];
    // Fast path: a one-chunk copy on an idle group is issued from the caller's thread (no dispatcher
    // hop); order is kept because nothing of this group is queued ahead of it.
    if (c->single_path && c->nchunks == 1 && host_mode == GE_HOST_DIRECT && g.copies.empty() &&
        g.ready.empty() && g.retry.empty() && !direct->failed) {
      Chunk *ch = make_chunk(c, c->next_chunk++);
      double t0 = real_now();  // issuing never waits: its wall time is its CPU time, and no system call
      int rc2 = issue_on(*direct, *ch);
      direct->cpu_ns += uint64_t((real_now() - t0) * 1e9);
      if (rc2 == GE_OK) return GE_OK;
      c->next_chunk = 0;  // let the dispatcher retry it (and fail over) the normal way
      delete ch;
    }
    g.copies.push_back(c);
  }
  g.cv.notify_all();
  return GE_OK;
}

uint64_t Engine::add_handle(const std::shared_ptr<Copy> &c) {
  std::lock_guard<std::mutex> lk(copies_m_);
  c->id = next_id_++;
  copies_[c->id] = c;
  return c->id;
}

// How a waiter polls its copy before it blocks on the copy's condition variable (see poll_until):
// yield for kWaitSpinS, then nap elapsed/kWaitNapFraction (at most kWaitMaxNapS), for up to kWaitPollS.
constexpr double kWaitSpinS = 200e-6;
constexpr double kWaitNapFraction = 256.0;
constexpr double kWaitMaxNapS = 20e-6;
constexpr double kWaitPollS = 0.05;

int Engine::wait(Copy &c, double timeout_s) {
  precise_timers();
  // Unbounded waits on one-chunk copies complete the chunk in this thread (bounded ones must not block).
  if (timeout_s < 0 && c.nchunks == 1 && !c.landed.load(std::memory_order_acquire)) wait_inline(c);
  // Poll first (the worker's futex wake-up of a blocked waiter costs tens of microseconds), then block.
  double poll_for = timeout_s < 0 ? kWaitPollS : std::min(timeout_s, kWaitPollS);
  if (poll_until([&] { return c.landed.load(std::memory_order_acquire); }, kWaitSpinS, kWaitNapFraction,
                 kWaitMaxNapS, poll_for)) {
    std::lock_guard<std::mutex> lk(c.m);
    return c.status;
  }
  std::unique_lock<std::mutex> lk(c.m);
  if (timeout_s < 0) c.cv.wait(lk, [&] { return c.finished; });
  else if (!c.cv.wait_for(lk, std::chrono::duration<double>(std::max(0.0, timeout_s - poll_for)),
                          [&] { return c.finished; }))
    return GE_ETIMEOUT;
  return c.status;
}

void Engine::progress(Copy &c, uint64_t *chunks, int *paths_used) {
  *chunks = c.chunks_done.load();
  std::lock_guard<std::mutex> lk(group_of(c.gpu, c.dir).m);
  *paths_used = int(std::count(c.path_used.begin(), c.path_used.end(), 1));
}

int Engine::copy_sync(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                      uint64_t *chunks, int *paths_used) {
  *chunks = 0;
  *paths_used = 0;
  int rc = copy_now(dir, gpu, dst, src, n, host_mode, stream);
  if (rc != kNotNow) {
    if (rc == GE_OK) *chunks = 1, *paths_used = 1;
    return rc;
  }
  if ((rc = stage_now(dir, gpu, dst, src, n, host_mode, stream, chunks)) != kNotNow) {
    if (rc == GE_OK) *paths_used = 1;
    return rc;
  }
  std::shared_ptr<Copy> c;
  if ((rc = start_copy(dir, gpu, dst, src, n, host_mode, stream, &c))) return rc;
  rc = wait(*c, -1.0);
  progress(*c, chunks, paths_used);
  return rc;
}

// The synchronous fast path (see kNotNow in scheduler.hpp).
int Engine::copy_now(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream) {
  bool direct_only = (host_mode & GE_COPY_DIRECT_ONLY) != 0;
  if ((host_mode & ~GE_COPY_DIRECT_ONLY) != GE_HOST_DIRECT || (dir != GE_H2D && dir != GE_D2H) || gpu < 0 ||
      gpu >= ngpu_ || !dst || !src || !n || stopping_)
    return kNotNow;
  Group &g = group_of(gpu, dir);
  uint64_t fallback;
  {
    std::lock_guard<std::mutex> lk(knob_m_);
    fallback = dir == GE_H2D ? knobs_.h2d_fallback_bytes : knobs_.d2h_fallback_bytes;
  }
  if (!direct_only && n >= fallback && g.paths.size() > 1) return kNotNow;
  if (!hold_direct(g)) return kNotNow;
  Path &p = *g.paths[0];
  Chunk ch;
  ch.len = n;
  ch.host = dir == GE_H2D ? src : dst;
  ch.dev = dir == GE_H2D ? dst : src;
  // A short copy spins in the driver's sync (CPU time == wall time), so it is charged its wall time:
  // reading the thread CPU clock is a system call (~0.6 us), which would show in a 10 us copy.
  bool exact = n >= kSpinBytes;
  if (exact) precise_timers();  // the backend may nap through a long copy
  uint64_t c0 = exact ? thread_cpu_ns() : 0;
  ch.issue_t = real_now();
  int rc = be_->copy_now(p, ch, stream);
  p.cpu_ns += exact ? thread_cpu_ns() - c0 : uint64_t((real_now() - ch.issue_t) * 1e9);
  if (rc == GE_OK) count_landed(p, n);
  return drop_direct(g, rc);
}

bool Engine::hold_direct(Group &g) {
  Path &p = *g.paths[0];
  std::lock_guard<std::mutex> lk(g.m);
  if (stopping_ || !g.copies.empty() || !g.ready.empty() || !g.retry.empty() || p.depth || p.failed) return false;
  p.depth++;
  return true;
}

int Engine::drop_direct(Group &g, int rc) {
  Path &p = *g.paths[0];
  std::lock_guard<std::mutex> lk(g.m);
  p.depth--;
  if (rc && rc != GE_ENOTSUP) p.failed = true;
  if (!g.copies.empty() || !g.ready.empty() || !g.retry.empty()) g.cv.notify_all();  // a chunk may wait for room
  return rc && rc != GE_ENOTSUP && g.paths.size() > 1 ? kNotNow : rc;
}

// The synchronous staged path (see stage_now in scheduler.hpp).
int Engine::stage_now(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                      uint64_t *chunks) {
  if (host_mode != GE_HOST_STAGED || (dir != GE_H2D && dir != GE_D2H) || gpu < 0 || gpu >= ngpu_ || !dst || !src ||
      !n || stopping_)
    return kNotNow;
  auto c = new_copy(dir, gpu, dst, src, n, host_mode, stream);
  Group &g = group_of(gpu, dir);
  if (!c->single_path || !hold_direct(g)) return kNotNow;  // relays: the dispatcher spreads it over the paths
  Path &p = *g.paths[0];
  precise_timers();
  uint64_t c0 = thread_cpu_ns(), pieces0 = StagingThreads::pieces_cpu_ns();
  int rc = be_->stream_begin(*c);
  if (rc == GE_OK) {
    if (dir == GE_H2D) {
      rc = stage_h2d_here(p, c);
    } else {
      if (!faulted_in(dst + n / 2)) advise_huge(dst, n);
      rc = stage_d2h_here(p, c);
    }
    be_->stream_end(*c);
  }
  p.cpu_ns += (thread_cpu_ns() - c0) - (StagingThreads::pieces_cpu_ns() - pieces0);  // pieces count in their copy
  *chunks = rc == GE_OK ? c->nchunks : 0;
  return drop_direct(g, rc);
}

// How long the caller of a synchronous staged copy naps while every staging slot is taken by other
// copies (its own chunks are all in flight, filling or draining, and each frees its slot in time).
constexpr std::chrono::microseconds kSlotNap{20};

int Engine::stage_d2h_here(Path &p, const std::shared_ptr<Copy> &c) {
  auto draining = std::make_shared<std::atomic<uint64_t>>(0);  // chunks landed and not yet drained
  std::deque<Chunk *> inflight;                                // issued, in stream order
  int rc = GE_OK;
  while (rc == GE_OK && (c->next_chunk < c->nchunks || !inflight.empty())) {
    while (c->next_chunk < c->nchunks) {  // every chunk the ring has a slot for goes on the stream now
      uint64_t slot = try_stage(*c);
      if (!slot) break;
      Chunk *ch = make_chunk(c, c->next_chunk++);
      ch->stage = ch->host = slot;
      ch->issue_t = real_now();
      if ((rc = be_->issue(p, *ch))) {
        release_stage(slot);
        delete ch;
        break;
      }
      inflight.push_back(ch);
    }
    if (inflight.empty()) {
      if (rc == GE_OK) std::this_thread::sleep_for(kSlotNap);
      continue;
    }
    Chunk *ch = inflight.front();
    inflight.pop_front();
    int r = be_->complete(p, *ch);
    if (r) {
      rc = r;
      release_stage(ch->stage);
      delete ch;
      continue;
    }
    count_landed(p, ch->len);
    draining->fetch_add(1);
    drain_chunk(p, ch, [ch, draining] {
      delete ch;
      draining->fetch_sub(1, std::memory_order_release);
    });
  }
  for (Chunk *ch : inflight) {  // after a failure: what is still on the stream lands, and is not drained
    be_->complete(p, *ch);
    release_stage(ch->stage);
    delete ch;
  }
  // The drains always end (a stopped pool runs them on the submitting thread): poll until they have,
  // starting each round of polling again after its kWaitPollS.
  auto drained = [&] { return draining->load(std::memory_order_acquire) == 0; };
  while (!poll_until(drained, kWaitSpinS, kWaitNapFraction, kWaitMaxNapS, kWaitPollS)) continue;
  return rc;
}

// A fill handed to the staging threads: its chunk, and whether its pieces are all copied.
struct Engine::Fill {
  Chunk *ch;
  std::shared_ptr<std::atomic<bool>> done;
};

int Engine::stage_h2d_here(Path &p, const std::shared_ptr<Copy> &c) {
  std::deque<Fill> filling;       // handed to the staging threads, in chunk order
  std::deque<Chunk *> inflight;   // on the path's stream, in order
  int rc = GE_OK;
  while (rc == GE_OK && (c->next_chunk < c->nchunks || !filling.empty() || !inflight.empty())) {
    bool room = true;
    while (c->next_chunk < c->nchunks) {  // every chunk the ring has a slot for is filled now
      uint64_t slot = try_stage(*c);
      if (!slot) {
        room = false;
        break;
      }
      Chunk *ch = make_chunk(c, c->next_chunk++);
      ch->stage = slot;
      auto done = std::make_shared<std::atomic<bool>>(false);
      filling.push_back({ch, done});
      staging_.copy(slot, ch->host, ch->len, kFillMode, [&p, done](uint64_t cpu_ns) {
        p.cpu_ns += cpu_ns;
        done->store(true, std::memory_order_release);
      });
    }
    while (!filling.empty() && filling.front().done->load(std::memory_order_acquire)) {
      Chunk *ch = filling.front().ch;
      filling.pop_front();
      ch->host = ch->stage;
      ch->issue_t = real_now();
      if ((rc = be_->issue(p, *ch))) {
        release_stage(ch->stage);
        delete ch;
        break;
      }
      inflight.push_back(ch);
    }
    if (rc) break;
    if (staging_.run_one()) continue;  // a queued piece: this thread copies it rather than wait
    if (!inflight.empty() && (filling.empty() || !room)) rc = land_oldest(p, inflight);
    else if (!filling.empty()) std::this_thread::yield();  // the last pieces run on other threads
    else if (!room) std::this_thread::sleep_for(kSlotNap);  // other copies hold every slot
  }
  // after a failure: the fills finish (they read the caller's memory), what is on the stream lands
  for (Fill &f : filling) {
    while (!f.done->load(std::memory_order_acquire))
      if (!staging_.run_one()) std::this_thread::yield();
    release_stage(f.ch->stage);
    delete f.ch;
  }
  while (!inflight.empty()) land_oldest(p, inflight);
  return rc;
}

int Engine::land_oldest(Path &p, std::deque<Chunk *> &inflight) {
  Chunk *ch = inflight.front();
  inflight.pop_front();
  int rc = be_->complete(p, *ch);
  if (rc == GE_OK) count_landed(p, ch->len);
  release_stage(ch->stage);
  delete ch;
  return rc;
}

std::shared_ptr<Copy> Engine::find(uint64_t h) {
  std::lock_guard<std::mutex> lk(copies_m_);
  auto it = copies_.find(h);
  return it == copies_.end() ? nullptr : it->second;
}

int Engine::release(uint64_t h) {
  std::lock_guard<std::mutex> lk(copies_m_);
  return copies_.erase(h) ? GE_OK : GE_EINVAL;
}

}  // namespace ge
