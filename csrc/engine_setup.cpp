// Engine set-up and shut-down, the staging threads, the engine's own pools (staging slots and relay
// buffers) and knob changes. The Engine class is declared in scheduler.hpp.
#include "scheduler.hpp"

namespace ge {

int validate_knobs(const ge_knobs &k) {
  auto chunk_ok = [](uint64_t v) { return v >= 4096 && v <= (1ull << 30); };
  if (!chunk_ok(k.h2d_chunk_bytes) || !chunk_ok(k.d2h_chunk_bytes)) return GE_EINVAL;
  if (k.outstanding < 1 || k.outstanding > 64) return GE_EINVAL;
  if (k.staging_threads < 1 || k.staging_threads > 64) return GE_EINVAL;
  if (k.h2d_fallback_bytes > (1ull << 50) || k.d2h_fallback_bytes > (1ull << 50)) return GE_EINVAL;
  return GE_OK;
}

int Engine::init(Backend *b, const ge_knobs &k, double scale) {
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

void Engine::add_path(Group &g, int via) {
  auto p = std::make_unique<Path>();
  p->id = int(paths.size());
  p->gpu = g.gpu;
  p->via = via;
  p->dir = g.dir;
  p->group = &g;
  g.paths.push_back(p.get());
  paths.push_back(std::move(p));
}

Engine::~Engine() {
  for (auto &g : groups) {
    {
      std::lock_guard<std::mutex> lk(g->m);  // a copy is queued before this or refused after it
      stopping = true;
    }
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
  // Every copy has finished now, so every blocked caller wakes; wait until they have left the engine.
  while (blocked_callers.load()) std::this_thread::sleep_for(kLeaveNap);
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
void Engine::resize_staging(int n) {
  std::lock_guard<std::mutex> lk(st_m);
  st_target = n;
  while (st_alive < st_target) {
    ++st_alive;
    st_threads.emplace_back([this] { staging_loop(); });
  }
  st_cv.notify_all();
}

void Engine::staging_loop() {
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

void Engine::submit_staging(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> lk(st_m);
    if (!st_stop) {
      st_tasks.push_back(std::move(f));
      st_cv.notify_one();
      return;
    }
  }
  f();  // closing, the staging threads are gone: a waiter finishing its own chunk does the memcpy itself
}

// ---- engine pools ------------------------------------------------------------------------
uint64_t Engine::need(const ge_knobs &k, int which) const {
  if (which < 0) return kSlots * slot_bytes(k);
  uint64_t n = 0;
  for (auto &p : paths)
    if (p->via == which && p->gpu != which) n += uint64_t(k.outstanding) * relay_bytes(k);
  return n;
}

int Engine::make_pool(int which, uint64_t slab) {
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

int Engine::set_knobs(const ge_knobs &k) {
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

uint64_t Engine::try_stage(const Copy &c) {
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

void Engine::release_stage(uint64_t ptr) {
  int shard = 0;
  gp_free(host_pool.pool, ptr, &shard);
  staged_live.fetch_sub(1);
  for (auto &g : groups) g->cv.notify_all();
}

int Engine::relay_get(int via, const Copy &c, uint64_t *ptr) {
  uint64_t largest = 0;
  return gp_alloc(dev_pools[via].pool, dev_pools[via].shard, relay_bytes(c.knobs), 0, ptr, &largest);
}

void Engine::relay_put(int via, uint64_t ptr) {
  int shard = 0;
  gp_free(dev_pools[via].pool, ptr, &shard);
}

}  // namespace ge
