// Engine set-up and shut-down, knob changes and what the C ABI reads (stats, pools). The Engine class
// is declared in scheduler.hpp.
#include <cstddef>
#include <type_traits>

#include "knob_limits.h"
#include "scheduler.hpp"

namespace ge {

// ge_knobs must have the layout of the knob table in gpudash/engine/config.py (the ctypes struct is built from it).
#define GE_KNOB_LAYOUT(field, type, offset, lo, hi)                                                   \
  static_assert(offsetof(ge_knobs, field) == (offset) &&                                             \
                    std::is_same<decltype(ge_knobs::field), type>::value,                          \
                "ge_knobs." #field " differs from gpudash/engine/config.py's knob table: change both, then " \
                "regenerate csrc/knob_limits.h with `python -m gpudash.engine.knob_header`");
GE_KNOB_TABLE(GE_KNOB_LAYOUT)
#undef GE_KNOB_LAYOUT
static_assert(sizeof(ge_knobs) == GE_KNOBS_SIZE, "ge_knobs differs in size from gpudash/engine/config.py's knob table");

// The native knobs' range check, generated from the knob table into knob_limits.h (Knob.check's limits).
int validate_knobs(const ge_knobs &k) { return GE_KNOBS_IN_RANGE(k) ? GE_OK : GE_EINVAL; }

int Engine::init(Backend *b, const ge_knobs &k, double scale) {
  be_.reset(b);
  time_scale_ = scale;
  int rc = be_->init(*this);
  if (rc) return rc;
  knobs_ = k;
  ngpu_ = be_->num_gpus();
  link_h2d_.reset(new std::atomic<uint64_t>[ngpu_]);
  link_d2h_.reset(new std::atomic<uint64_t>[ngpu_]);
  for (int i = 0; i < ngpu_; ++i) link_h2d_[i] = 0, link_d2h_[i] = 0;
  std::vector<int> relays_via(size_t(ngpu_), 0);
  for (int g = 0; g < ngpu_; ++g)
    for (int dir = 0; dir < 2; ++dir) {
      auto grp = std::make_unique<Group>();
      grp->gpu = g;
      grp->dir = dir;
      add_path(*grp, g);
      for (int p = 0; p < ngpu_; ++p) {
        if (p == g) continue;
        double bw = dir == GE_H2D ? be_->peer_gbps(p, g) : be_->peer_gbps(g, p);
        if (bw == 0) continue;
        add_path(*grp, p);
        ++relays_via[size_t(p)];
      }
      groups_.push_back(std::move(grp));
    }
  for (auto &p : paths_)
    if ((rc = be_->prepare_path(*p))) return rc;
  if ((rc = pools_.create(*be_, relays_via, k))) return rc;
  for (auto &g : groups_) g->dispatcher = std::thread([this, gp = g.get()] { dispatch_loop(*gp); });
  for (auto &p : paths_) p->worker = std::thread([this, pp = p.get()] { worker_loop(*pp); });
  staging_.resize(k.staging_threads);
  return GE_OK;
}

void Engine::add_path(Group &g, int via) {
  auto p = std::make_unique<Path>();
  p->id = int(paths_.size());
  p->gpu = g.gpu;
  p->via = via;
  p->dir = g.dir;
  p->group = &g;
  g.paths.push_back(p.get());
  paths_.push_back(std::move(p));
}

// The order matters: every thread that could still issue or settle a chunk is joined before the
// next one goes, so that each copy ends finished (landed, failed, or GE_ECLOSED) and its waiters wake.
void Engine::stop_threads() {
  for (auto &g : groups_) {
    {
      std::lock_guard<std::mutex> lk(g->m);  // a copy is queued before this or refused after it
      stopping_ = true;
    }
    g->cv.notify_all();
    for (auto *p : g->paths) p->cv.notify_all();
  }
  for (auto &g : groups_)  // each fails what it never issued (fail_unissued)
    if (g->dispatcher.joinable()) g->dispatcher.join();
  for (auto &p : paths_)  // each lands what was issued on its path
    if (p->worker.joinable()) p->worker.join();
  staging_.stop();  // runs the fills and drains still queued; later ones run on their caller's thread
  for (auto &g : groups_) {  // staged chunks filled after their dispatcher left
    for (Chunk *c : g->ready) finish_chunk(c, GE_ECLOSED);
    g->ready.clear();
  }
}

Engine::~Engine() {
  stop_threads();
  // Every copy has finished now, so every blocked caller wakes; wait until they have left the engine.
  while (blocked_callers_.load()) std::this_thread::sleep_for(kLeaveNap);
  if (be_) {
    for (auto &p : paths_) be_->release_path(*p);
    pools_.release(*be_);
  }
}

// ---- knobs and what the C ABI reads --------------------------------------------------------
ge_knobs Engine::knobs() {
  std::lock_guard<std::mutex> lk(knob_m_);
  return knobs_;
}

int Engine::set_knobs(const ge_knobs &k) {
  {
    std::lock_guard<std::mutex> lk(knob_m_);
    if (int rc = pools_.grow_for(k)) return rc;
    knobs_ = k;
  }
  staging_.resize(k.staging_threads);
  return GE_OK;
}

void Engine::path_stats(int i, ge_path_stats *out) {
  Path &p = *paths_[size_t(i)];
  ge_path_stats &s = *out;
  s.gpu = p.gpu;
  s.via = p.via;
  s.direction = p.dir;
  {
    std::lock_guard<std::mutex> lk(p.group->m);
    s.failed = p.failed;
    s.queue_depth = p.depth;
  }
  s.bytes = p.bytes.load();
  s.chunks = p.chunks.load();
  s.gbps = rate(p);
  s.cpu_s = double(p.cpu_ns.load()) / 1e9;
  s.reserved = 0;
}

void Engine::link_stats(int gpu, ge_link_stats *out) {
  out->gpu = gpu;
  out->reserved = 0;
  out->h2d_bytes = link_h2d_[gpu].load();
  out->d2h_bytes = link_d2h_[gpu].load();
  be_->link_gbps(gpu, &out->h2d_gbps, &out->d2h_gbps);
}

int Engine::path_id(int gpu, int via, int dir) const {
  for (auto &p : paths_)
    if (p->gpu == gpu && p->via == via && p->dir == dir) return p->id;
  return -1;
}

void Engine::heal_path(int id) {
  Path &p = *paths_[size_t(id)];
  std::lock_guard<std::mutex> lk(p.group->m);
  p.failed = false;
}

void Engine::release_stage(uint64_t ptr) {
  pools_.release_slot(ptr);
  for (auto &g : groups_) g->cv.notify_all();  // a dispatcher may wait for a slot
}

}  // namespace ge
