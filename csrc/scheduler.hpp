// The scheduler shared by both backends: per-(GPU, direction) micro-task queues, chunking, passive
// load balancing over paths (shortest queue, direct first), the pinned staging ring for pageable
// memory, the engine's pools (staging and relay buffers) and stats. engine.cpp wraps it in the C ABI.
#pragma once
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "engine_core.hpp"
#include "gpudash_pool.h"

namespace ge {

static constexpr int kSlots = 32;
static constexpr uint64_t kSlotBytes = 4ull << 20;
static constexpr uint64_t kHugeBytes = 2ull << 20;  // a transparent huge page
static constexpr int kMaxAttempts = 8;
static constexpr int kPoolHeadroom = 4;  // a relay pool's slab holds 4x what the creation knobs need

static uint64_t round_page(uint64_t v) { return (v + 4095) & ~uint64_t(4095); }

static uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

static double real_now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

int validate_knobs(const ge_knobs &k) {
  auto chunk_ok = [](uint64_t v) { return v >= 4096 && v <= (1ull << 30); };
  if (!chunk_ok(k.h2d_chunk_bytes) || !chunk_ok(k.d2h_chunk_bytes)) return GE_EINVAL;
  if (k.outstanding < 1 || k.outstanding > 64) return GE_EINVAL;
  if (k.staging_threads < 1 || k.staging_threads > 64) return GE_EINVAL;
  if (k.h2d_fallback_bytes > (1ull << 50) || k.d2h_fallback_bytes > (1ull << 50)) return GE_EINVAL;
  return GE_OK;
}

// Waiters poll in short naps (poll_until); a 1 us timer slack keeps
// those naps short (the default slack is 50 us).
static void precise_timers() {
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
  std::atomic<bool> stopping{false};
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

  int init(Backend *b, const ge_knobs &k, double scale) {
    be.reset(b);
    time_scale = scale;
    int rc = be->init(*this);
    if (rc) return rc;
    knobs = k;
    ngpu = be->num_gpus();
    link_h2d.reset(new std::atomic<uint64_t>[ngpu]);
    link_d2h.reset(new std::atomic<uint64_t>[ngpu]);
    for (int i = 0; i < ngpu; ++i) link_h2d[i] = 0, link_d2h[i] = 0;
    for (int g = 0; g < ngpu; ++g)
      for (int dir = 0; dir < 2; ++dir) {
        auto grp = std::make_unique<Group>();
        grp->gpu = g;
        grp->dir = dir;
        add_path(*grp, g);
        for (int p = 0; p < ngpu; ++p) {
          if (p == g) continue;
          double bw = dir == GE_H2D ? be->peer_gbps(p, g) : be->peer_gbps(g, p);
          if (bw != 0) add_path(*grp, p);
        }
        groups.push_back(std::move(grp));
      }
    for (auto &p : paths)
      if ((rc = be->prepare_path(*p))) return rc;
    dev_pools.resize(ngpu);
    if ((rc = make_pool(-1, kSlots * kSlotBytes))) return rc;
    for (int g = 0; g < ngpu; ++g)
      if (need(k, g) && (rc = make_pool(g, kPoolHeadroom * need(k, g)))) return rc;
    for (auto &g : groups) g->dispatcher = std::thread([this, gp = g.get()] { dispatch_loop(*gp); });
    for (auto &p : paths) p->worker = std::thread([this, pp = p.get()] { worker_loop(*pp); });
    resize_staging(k.staging_threads);
    return GE_OK;
  }

  void add_path(Group &g, int via) {
    auto p = std::make_unique<Path>();
    p->id = int(paths.size());
    p->gpu = g.gpu;
    p->via = via;
    p->dir = g.dir;
    p->group = &g;
    g.paths.push_back(p.get());
    paths.push_back(std::move(p));
  }

  ~Engine() {
    stopping = true;
    for (auto &g : groups) {
      { std::lock_guard<std::mutex> lk(g->m); }
      g->cv.notify_all();
      for (auto *p : g->paths) p->cv.notify_all();
    }
    for (auto &g : groups)
      if (g->dispatcher.joinable()) g->dispatcher.join();
    for (auto &p : paths)
      if (p->worker.joinable()) p->worker.join();
    {
      std::lock_guard<std::mutex> lk(st_m);
      st_stop = true;
    }
    st_cv.notify_all();
    for (auto &t : st_threads) t.join();
    for (auto &g : groups) {  // staged chunks filled after their dispatcher left
      for (Chunk *c : g->ready) finish_chunk(c, GE_ECLOSED);
      g->ready.clear();
    }
    if (be) {
      for (auto &p : paths) be->release_path(*p);
      for (int w = -1; w < int(dev_pools.size()); ++w) {
        EnginePool &P = pool_of(w);
        if (P.pool) gp_pool_destroy(P.pool);
        if (P.slab) w < 0 ? be->free_host(P.slab) : be->free_device(P.slab);
      }
    }
  }

  // ---- staging threads -------------------------------------------------------------------
  void resize_staging(int n) {
    std::lock_guard<std::mutex> lk(st_m);
    st_target = n;
    while (st_alive < st_target) {
      ++st_alive;
      st_threads.emplace_back([this] { staging_loop(); });
    }
    st_cv.notify_all();
  }

  void staging_loop() {
    std::unique_lock<std::mutex> lk(st_m);
    for (;;) {
      st_cv.wait(lk, [&] { return st_stop || !st_tasks.empty() || st_alive > st_target; });
      if (st_alive > st_target) { --st_alive; return; }
      if (st_tasks.empty()) return;  // st_stop
      auto task = std::move(st_tasks.front());
      st_tasks.pop_front();
      lk.unlock();
      task();
      lk.lock();
    }
  }

  void submit_staging(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(st_m);
      st_tasks.push_back(std::move(f));
    }
    st_cv.notify_one();
  }

  // ---- engine pools ------------------------------------------------------------------------
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
  uint64_t need(const ge_knobs &k, int which) const {
    if (which < 0) return kSlots * slot_bytes(k);
    uint64_t n = 0;
    for (auto &p : paths)
      if (p->via == which && p->gpu != which) n += uint64_t(k.outstanding) * relay_bytes(k);
    return n;
  }

  int make_pool(int which, uint64_t slab) {
    EnginePool &P = pool_of(which);
    int rc = which < 0 ? be->alloc_host(slab, &P.slab) : be->alloc_device(which, slab, &P.slab);
    if (rc) return rc;
    P.size = slab;
    P.granule = which < 0 ? 4096 : 256;  // page-aligned slots; cuMemAlloc aligns device memory to 256 B
    if ((rc = gp_pool_create(P.slab, slab, P.granule, &P.pool))) return rc;
    gp_pool_set_policy(P.pool, GP_POLICY_BANDED);  // blocks packed low: few pages ever touched
    uint64_t detail = 0;
    P.floor = need(knobs, which);
    return gp_shard_add(P.pool, P.floor, &P.shard, &detail);
  }

  // What pool `which` must hold at the least: one chunk on every relay path (all the ring's slots).
  uint64_t need_min(ge_knobs k, int which) const {
    k.outstanding = 1;
    return need(k, which);
  }

  // New knobs, with every engine shard grown to what they need (at most its whole pool); GE_ENOMEM and
  // nothing changed when a pool cannot hold need_min. Shards never shrink here: a copy in flight may
  // still use the older sizes.
  int set_knobs(const ge_knobs &k) {
    std::lock_guard<std::mutex> lk(knob_m);
    for (int w = -1; w < ngpu; ++w)
      if (pool_of(w).pool && need_min(k, w) > pool_of(w).size) return GE_ENOMEM;
    for (int w = -1; w < ngpu; ++w) {
      EnginePool &P = pool_of(w);
      uint64_t n = std::min(need(k, w), P.size), detail = 0;
      gp_shard_stats st{};
      if (!P.pool || n <= P.floor) continue;
      P.floor = n;
      gp_stats(P.pool, P.shard, &st);
      // the shard is its pool's only one, so the slab's unassigned bytes cover the growth
      if (st.capacity < n && gp_shard_resize(P.pool, P.shard, n, &detail)) return GE_ENOMEM;
    }
    knobs = k;
    return GE_OK;
  }

  // A staging slot for a chunk of copy c, or 0 while the ring is at its depth or the shard has no
  // room (the caller waits; a slot that did not fit counts as a failure in the shard's stats).
  uint64_t try_stage(const Copy &c) {
    if (staged_live.fetch_add(1) >= kSlots) {
      staged_live.fetch_sub(1);
      return 0;
    }
    uint64_t ptr = 0, largest = 0;
    if (gp_alloc(host_pool.pool, host_pool.shard, slot_bytes(c.knobs), 0, &ptr, &largest)) {
      staged_live.fetch_sub(1);
      return 0;
    }
    return ptr;
  }

  void release_stage(uint64_t ptr) {
    int shard = 0;
    gp_free(host_pool.pool, ptr, &shard);
    staged_live.fetch_sub(1);
    for (auto &g : groups) g->cv.notify_all();
  }

  // Shift of a staged D2H copy's chunk grid (the first chunk is `chunk - skew` bytes) that puts chunk
  // boundaries on 2 MiB boundaries of the destination (or on multiples of a chunk that divides 2 MiB):
  // then no two staging threads fault the same fresh huge page, where one would wait while the other
  // has the kernel zero it.
  static uint64_t huge_skew(uint64_t dst, uint64_t chunk) {
    uint64_t a = chunk % kHugeBytes == 0 ? kHugeBytes : kHugeBytes % chunk == 0 ? chunk : 0;
    uint64_t first = a ? (a - dst % a) % a : 0;
    return first ? chunk - first : 0;
  }

  // A staged D2H destination is usually fresh memory: ask for huge pages over all of it at once, so the
  // staging threads' memcpy faults (and the kernel zeroes) 2 MiB pages, not 4 KiB ones. Advice only.
  // (Faulting each chunk ahead with MADV_POPULATE_WRITE was slower on the H200 host: 20.8 vs 27 GB/s
  // with 12 threads, and it collapsed with 16.)
  static void advise_huge(uint64_t addr, uint64_t len) {
    uint64_t lo = (addr + kHugeBytes - 1) & ~(kHugeBytes - 1), hi = (addr + len) & ~(kHugeBytes - 1);
    if (hi > lo) madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_HUGEPAGE);
  }

  // Relay buffers: blocks of the via GPU's "relay" shard.
  int relay_get(int via, const Copy &c, uint64_t *ptr) {
    uint64_t largest = 0;
    return gp_alloc(dev_pools[via].pool, dev_pools[via].shard, relay_bytes(c.knobs), 0, ptr, &largest);
  }
  void relay_put(int via, uint64_t ptr) {
    int shard = 0;
    gp_free(dev_pools[via].pool, ptr, &shard);
  }

  // ---- copies ------------------------------------------------------------------------------
  void finish_chunk(Chunk *ch, int rc) {
    auto c = ch->copy;
    delete ch;
    if (rc) {
      std::lock_guard<std::mutex> lk(c->m);
      if (c->status == GE_OK) c->status = rc;
    }
    c->chunks_done.fetch_add(1);
    if (c->remaining.fetch_sub(1) == 1) finish_copy(*c);
  }

  void finish_copy(Copy &c) {
    be->stream_end(c);
    std::lock_guard<std::mutex> lk(c.m);
    c.finished = true;
    c.landed.store(true, std::memory_order_release);
    c.cv.notify_all();
  }

  Path *pick_path(Group &g, const Copy &c, bool *all_failed) {
    Path *best = nullptr;
    *all_failed = true;
    Path *direct = g.paths[0];
    // A copy that only the direct path takes keeps that path's stream fed with every chunk it has
    // (staged copies are bounded by the ring's slots), so the copy engine never idles between chunks.
    int limit = c.single_path ? INT32_MAX : c.knobs.outstanding;
    if (!direct->failed) {
      *all_failed = false;
      if (direct->depth < limit && (c.single_path || c.knobs.direct_first)) return direct;
      if (c.single_path) return nullptr;  // below the fallback threshold: wait for the direct path
    }
    for (Path *p : g.paths) {
      if (p->failed) continue;
      *all_failed = false;
      if (p->depth >= limit) continue;
      if (!best || p->depth < best->depth) best = p;
    }
    return best;
  }

  Chunk *make_chunk(const std::shared_ptr<Copy> &c, uint64_t idx) {
    auto *ch = new Chunk;
    ch->copy = c;
    ch->off = idx ? idx * c->chunk - c->skew : 0;
    ch->len = std::min((idx + 1) * c->chunk - c->skew, c->nbytes) - ch->off;
    if (c->dir == GE_H2D) {
      ch->host = c->src + ch->off;
      ch->dev = c->dst + ch->off;
    } else {
      ch->host = c->dst + ch->off;
      ch->dev = c->src + ch->off;
    }
    return ch;
  }

  void dispatch_loop(Group &g) {
    be->thread_init(g.gpu);
    std::unique_lock<std::mutex> lk(g.m);
    for (;;) {
      if (stopping) break;
      Chunk *ch = nullptr;
      std::deque<Chunk *> *from = nullptr;
      std::shared_ptr<Copy> c;
      if (!g.retry.empty()) from = &g.retry;
      else if (!g.ready.empty()) from = &g.ready;
      if (from) {
        ch = from->front();
        c = ch->copy;
      } else if (!g.copies.empty()) {
        c = g.copies.front();
        if (c->next_chunk >= c->nchunks) {
          g.copies.pop_front();
          continue;
        }
        if (c->host_mode == GE_HOST_STAGED && c->dir == GE_H2D) {  // fill a slot first
          uint64_t slot = try_stage(*c);
          if (!slot) {
            g.cv.wait_for(lk, std::chrono::milliseconds(2));
            continue;
          }
          Chunk *nc = make_chunk(c, c->next_chunk++);
          nc->stage = slot;
          Path *direct = g.paths[0];
          submit_staging([this, nc, slot, &g, direct] {
            uint64_t t0 = thread_cpu_ns();
            std::memcpy(reinterpret_cast<void *>(slot), reinterpret_cast<const void *>(nc->host), nc->len);
            nc->host = slot;
            direct->cpu_ns += thread_cpu_ns() - t0;
            {
              std::lock_guard<std::mutex> l2(g.m);
              g.ready.push_back(nc);
            }
            g.cv.notify_all();
          });
          continue;
        }
      } else {
        g.cv.wait(lk, [&] { return stopping || !g.copies.empty() || !g.ready.empty() || !g.retry.empty(); });
        continue;
      }
      bool all_failed = false;
      Path *p = pick_path(g, *c, &all_failed);
      if (all_failed) {
        if (!ch) ch = make_chunk(c, c->next_chunk++);
        else from->pop_front();
        if (ch->stage) release_stage(ch->stage);
        lk.unlock();
        finish_chunk(ch, GE_EPATH);
        lk.lock();
        continue;
      }
      if (!p) {
        g.cv.wait_for(lk, std::chrono::milliseconds(2));
        continue;
      }
      if (!ch) {  // a new chunk of the front copy
        uint64_t s = 0;
        if (c->host_mode == GE_HOST_STAGED) {  // D2H: the path writes into a slot
          s = try_stage(*c);
          if (!s) {
            g.cv.wait_for(lk, std::chrono::milliseconds(2));
            continue;
          }
        }
        ch = make_chunk(c, c->next_chunk++);
        ch->stage = s;
      } else {
        from->pop_front();
      }
      if (ch->stage && c->dir == GE_D2H) ch->host = ch->stage;
      uint64_t t0 = thread_cpu_ns();
      if (p->via != p->gpu && relay_get(p->via, *c, &ch->relay)) {
        // the relay shard is full for now (blocks come back as relayed chunks land): wait like for a
        // busy path; the direct path takes the chunk once it has room
        g.retry.push_front(ch);
        g.cv.wait_for(lk, std::chrono::milliseconds(2));
        continue;
      }
      int rc = issue_on(*p, *ch);
      p->cpu_ns += thread_cpu_ns() - t0;
      if (rc) {
        if (ch->relay) relay_put(p->via, ch->relay), ch->relay = 0;
        p->failed = true;
        g.retry.push_front(ch);
        continue;
      }
    }
    // closing: fail what was never issued
    auto fail_all = [&](std::deque<Chunk *> &dq) {
      while (!dq.empty()) {
        Chunk *x = dq.front();
        dq.pop_front();
        if (x->stage) release_stage(x->stage);
        lk.unlock();
        finish_chunk(x, GE_ECLOSED);
        lk.lock();
      }
    };
    fail_all(g.retry);
    while (!g.copies.empty()) {
      auto c = g.copies.front();
      g.copies.pop_front();
      uint64_t left = c->nchunks - c->next_chunk;
      c->next_chunk = c->nchunks;
      for (uint64_t i = 0; i < left; ++i) {
        Chunk *x = new Chunk;
        x->copy = c;
        lk.unlock();
        finish_chunk(x, GE_ECLOSED);
        lk.lock();
      }
    }
  }

  // Issue a chunk on a path (group lock held) and hand it to the path's worker.
  int issue_on(Path &p, Chunk &ch) {
    ch.issue_t = real_now();
    int rc = be->issue(p, ch);
    if (rc) return rc;
    ch.copy->path_used[p.id] = 1;
    p.depth++;
    if (ch.copy->nchunks == 1) ch.copy->sole_path = &p;
    p.q.push_back(&ch);
    p.cv.notify_one();
    return GE_OK;
  }

  void mark_rate(Path &p) {
    double now = real_now();
    std::lock_guard<std::mutex> lk(p.rate_m);
    int last = (p.mark_i + 15) % 16;
    if (p.mark_n && now - p.mark_t[last] < 1.0 / 16) return;
    p.mark_t[p.mark_i] = now;
    p.mark_b[p.mark_i] = p.bytes.load();
    p.mark_i = (p.mark_i + 1) % 16;
    p.mark_n = std::min(p.mark_n + 1, 16);
  }

  double rate(Path &p) {
    double now = real_now();
    std::lock_guard<std::mutex> lk(p.rate_m);
    int best = -1;
    for (int i = 0; i < p.mark_n; ++i)
      if (p.mark_t[i] >= now - 1.0 && (best < 0 || p.mark_t[i] < p.mark_t[best])) best = i;
    if (best < 0) return 0.0;
    double dt = now - p.mark_t[best];
    if (dt < 1e-3) return 0.0;
    return double(p.bytes.load() - p.mark_b[best]) / (dt / time_scale) / 1e9;
  }

  // Waits for a chunk the caller took off the path's queue, then settles it (group lock not held).
  void run_chunk(Path &p, Chunk *ch, std::unique_lock<std::mutex> &lk) {
    uint64_t t0 = thread_cpu_ns();
    int rc = be->complete(p, *ch);
    p.cpu_ns += thread_cpu_ns() - t0;
    if (ch->relay) relay_put(p.via, ch->relay), ch->relay = 0;
    lk.lock();
    settle(p, ch, rc, lk);
  }

  // Book a completed (or failed) chunk: stats, retry on another path, staging drain, copy completion.
  // Called with the group lock held; returns with it held.
  void settle(Path &p, Chunk *ch, int rc, std::unique_lock<std::mutex> &lk) {
    Group &g = *p.group;
    p.depth--;
    if (rc) {
      p.failed = true;
      if (++ch->attempts < kMaxAttempts && !stopping) {
        if (ch->stage && ch->copy->dir == GE_D2H) ch->host = ch->stage;
        g.retry.push_back(ch);
        g.cv.notify_all();
        return;
      }
      g.cv.notify_all();
      lk.unlock();
      if (ch->stage) release_stage(ch->stage);
      finish_chunk(ch, rc);
      lk.lock();
      return;
    }
    p.bytes += ch->len;
    p.chunks += 1;
    (p.dir == GE_H2D ? link_h2d : link_d2h)[p.via] += ch->len;
    g.cv.notify_all();
    lk.unlock();
    mark_rate(p);
    if (ch->stage && ch->copy->dir == GE_D2H) {
      submit_staging([this, ch, &p] {
        uint64_t t1 = thread_cpu_ns();
        const Copy &c = *ch->copy;
        std::memcpy(reinterpret_cast<void *>(c.dst + ch->off), reinterpret_cast<const void *>(ch->host), ch->len);
        p.cpu_ns += thread_cpu_ns() - t1;
        release_stage(ch->stage);
        finish_chunk(ch, GE_OK);
      });
    } else {
      if (ch->stage) release_stage(ch->stage);
      finish_chunk(ch, GE_OK);
    }
    lk.lock();
  }

  void worker_loop(Path &p) {
    be->thread_init(p.via);
    precise_timers();
    Group &g = *p.group;
    std::unique_lock<std::mutex> lk(g.m);
    for (;;) {
      p.cv.wait(lk, [&] { return !p.q.empty() || stopping; });
      if (p.q.empty()) return;
      Chunk *ch = p.q.front();
      p.q.pop_front();
      lk.unlock();
      run_chunk(p, ch, lk);
    }
  }

  // A waiter that finds its copy's only chunk still queued completes it itself: one thread polls the
  // event instead of a worker polling and then waking the waiter (a futex wake-up costs tens of us).
  void wait_inline(Copy &c) {
    Group &g = *groups[c.gpu * 2 + c.dir];
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

  // Starts a copy: a one-chunk copy on an idle group is issued from the caller's thread (no dispatcher
  // hop) and handed to the path's worker, unless its waiter completes it first; others are queued.
  int start_copy(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                 std::shared_ptr<Copy> *out) {
    if (stopping) return GE_ECLOSED;
    if (dir != GE_H2D && dir != GE_D2H) return GE_EINVAL;
    bool direct_only = (host_mode & GE_COPY_DIRECT_ONLY) != 0;
    host_mode &= ~GE_COPY_DIRECT_ONLY;
    if (host_mode != GE_HOST_DIRECT && host_mode != GE_HOST_STAGED) return GE_EINVAL;
    if (gpu < 0 || gpu >= ngpu) return GE_ENODEV;
    if (!dst || !src) return GE_EINVAL;
    auto c = std::make_shared<Copy>();
    {
      std::lock_guard<std::mutex> lk(knob_m);
      c->knobs = knobs;
    }
    c->dir = dir;
    c->gpu = gpu;
    c->dst = dst;
    c->src = src;
    c->nbytes = n;
    c->host_mode = host_mode;
    c->stream = stream;
    Group &g = *groups[gpu * 2 + dir];
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
    c->path_waited.assign(paths.size(), 0);
    c->path_used.assign(paths.size(), 0);
    int rc = be->stream_begin(*c);
    if (rc) return rc;
    *out = c;
    if (c->nchunks == 0) {
      finish_copy(*c);
      return GE_OK;
    }
    if (host_mode == GE_HOST_STAGED && dir == GE_D2H) advise_huge(dst, n);
    {
      std::lock_guard<std::mutex> lk(g.m);
      Path *direct = g.paths[0];
      // Fast path: a one-chunk copy on an idle group is issued from the caller's thread (no dispatcher
      // hop); order is kept because nothing of this group is queued ahead of it.
      if (c->single_path && c->nchunks == 1 && host_mode == GE_HOST_DIRECT && g.copies.empty() &&
          g.ready.empty() && g.retry.empty() && !direct->failed) {
        Chunk *ch = make_chunk(c, c->next_chunk++);
        uint64_t t0 = thread_cpu_ns();
        int rc2 = issue_on(*direct, *ch);
        direct->cpu_ns += thread_cpu_ns() - t0;
        if (rc2 == GE_OK) return GE_OK;
        c->next_chunk = 0;  // let the dispatcher retry it (and fail over) the normal way
        delete ch;
      }
      g.copies.push_back(c);
    }
    g.cv.notify_all();
    return GE_OK;
  }

  // Registers a started copy under a new handle (ge_copy); synchronous copies never need one.
  uint64_t add_handle(const std::shared_ptr<Copy> &c) {
    std::lock_guard<std::mutex> lk(copies_m);
    c->id = next_id++;
    copies[c->id] = c;
    return c->id;
  }

  // GE_OK when the copy is done, GE_ETIMEOUT while it runs (timeout_s < 0: wait forever), else its error.
  int wait(Copy &c, double timeout_s) {
    precise_timers();
    // Unbounded waits on one-chunk copies complete the chunk in this thread (bounded ones must not block).
    if (timeout_s < 0 && c.nchunks == 1 && !c.landed.load(std::memory_order_acquire)) wait_inline(c);
    // Poll first (the worker's futex wake-up of a blocked waiter costs tens of microseconds), then block.
    double poll_for = timeout_s < 0 ? 0.05 : std::min(timeout_s, 0.05);
    if (poll_until([&] { return c.landed.load(std::memory_order_acquire); }, 200e-6, 256.0, 20e-6, poll_for)) {
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

  // Chunks completed and paths used by a copy.
  void progress(Copy &c, uint64_t *chunks, int *paths_used) {
    *chunks = c.chunks_done.load();
    std::lock_guard<std::mutex> lk(groups[c.gpu * 2 + c.dir]->m);
    *paths_used = int(std::count(c.path_used.begin(), c.path_used.end(), 1));
  }

  // A whole copy on the caller's thread: one driver copy and one stream sync when it can (see
  // copy_now), else start it and wait (a one-chunk copy is then completed inline by wait()).
  int copy_sync(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream,
                uint64_t *chunks, int *paths_used) {
    *chunks = 0;
    *paths_used = 0;
    int rc = copy_now(dir, gpu, dst, src, n, host_mode, stream);
    if (rc != kNotNow) {
      if (rc == GE_OK) *chunks = 1, *paths_used = 1;
      return rc;
    }
    std::shared_ptr<Copy> c;
    if ((rc = start_copy(dir, gpu, dst, src, n, host_mode, stream, &c))) return rc;
    rc = wait(*c, -1.0);
    progress(*c, chunks, paths_used);
    return rc;
  }

  // The synchronous fast path: a single-path direct copy while its group is idle and its direct path
  // has nothing in flight is issued and completed by the backend on this thread, with no Copy, no
  // chunk queue, no event and no other thread woken (a small copy then costs what the driver calls
  // cost). kNotNow: not eligible (or it failed while relays could take it): use the general path.
  static constexpr int kNotNow = 1;
  int copy_now(int dir, int gpu, uint64_t dst, uint64_t src, uint64_t n, int host_mode, uint64_t stream) {
    bool direct_only = (host_mode & GE_COPY_DIRECT_ONLY) != 0;
    if ((host_mode & ~GE_COPY_DIRECT_ONLY) != GE_HOST_DIRECT || (dir != GE_H2D && dir != GE_D2H) || gpu < 0 ||
        gpu >= ngpu || !dst || !src || !n || stopping)
      return kNotNow;
    Group &g = *groups[gpu * 2 + dir];
    uint64_t fallback;
    {
      std::lock_guard<std::mutex> lk(knob_m);
      fallback = dir == GE_H2D ? knobs.h2d_fallback_bytes : knobs.d2h_fallback_bytes;
    }
    if (!direct_only && n >= fallback && g.paths.size() > 1) return kNotNow;
    Path &p = *g.paths[0];
    {
      std::lock_guard<std::mutex> lk(g.m);
      if (!g.copies.empty() || !g.ready.empty() || !g.retry.empty() || p.depth || p.failed) return kNotNow;
      p.depth++;
    }
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
    int rc = be->copy_now(p, ch, stream);
    p.cpu_ns += exact ? thread_cpu_ns() - c0 : uint64_t((real_now() - ch.issue_t) * 1e9);
    if (rc == GE_OK) {
      p.bytes += n;
      p.chunks += 1;
      (dir == GE_H2D ? link_h2d : link_d2h)[gpu] += n;
      mark_rate(p);
    }
    std::lock_guard<std::mutex> lk(g.m);
    p.depth--;
    if (rc && rc != GE_ENOTSUP) p.failed = true;
    if (!g.copies.empty() || !g.ready.empty() || !g.retry.empty()) g.cv.notify_all();  // a chunk may wait for room
    return rc && rc != GE_ENOTSUP && g.paths.size() > 1 ? kNotNow : rc;
  }

  std::shared_ptr<Copy> find(uint64_t h) {
    std::lock_guard<std::mutex> lk(copies_m);
    auto it = copies.find(h);
    return it == copies.end() ? nullptr : it->second;
  }
};

}  // namespace ge

