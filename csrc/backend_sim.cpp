// sim backend: "device" memory is host memory; every chunk really moves its bytes with memcpy, and
// completes when the link model says it lands. Each link direction is a FIFO resource with a payload
// rate; a chunk reserves it at issue time and its worker sleeps until the reserved end (+ latency).
// Time runs `time_scale` times slower than real time, so the host's memcpy keeps up with the modelled
// links; all rates the engine reports on sim are in simulated seconds.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <thread>

#include "backend_sim.hpp"

namespace ge {
namespace {

struct Resource {
  double gbps = 0;
  double next_free = 0;  // sim seconds
  double reserve(double t0, uint64_t n) {
    double s = std::max(t0, next_free);
    next_free = s + double(n) / (gbps * 1e9);
    return next_free;
  }
};

struct Alloc {
  uint64_t size;
  int kind;
  int gpu;
  bool owned;  // allocated by us (free) vs registered user memory
};

class SimBackend final : public Backend, public SimControls {
 public:
  SimBackend(int n, const double *link, const double *lat, const double *peer, double nvlink, double scale)
      : n_(n), scale_(scale), nvlink_(nvlink) {
    for (int i = 0; i < n; ++i) {
      lat_.push_back(lat[i] * 1e-6);
      h2d_.push_back({link[i], 0});
      d2h_.push_back({link[i], 0});
    }
    peer_.assign(peer, peer + size_t(n) * size_t(n));
    pair_.resize(size_t(n) * size_t(n));
    for (size_t i = 0; i < pair_.size(); ++i) pair_[i].gbps = peer_[i];
    t0_ = std::chrono::steady_clock::now();
  }

  int init(Engine &) override { return GE_OK; }
  int num_gpus() const override { return n_; }
  std::string device_name(int gpu) override { return "sim GPU " + std::to_string(gpu); }
  double peer_gbps(int a, int b) override { return peer_[size_t(a) * n_ + b]; }

  int prepare_path(Path &p) override {
    (void)p;  // ids arrive in order: path p.id is fail_[p.id]
    fail_.emplace_back(false);
    return GE_OK;
  }

  double now() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count() / scale_;
  }

  // Peer stage a -> b starting no earlier than t: over NVLink (per-pair rate), or over both GPUs'
  // PCIe links when the peers talk through the PCIe switch.
  double peer_stage(int a, int b, double t, uint64_t n) {
    if (nvlink_ > 0) return pair_[size_t(a) * n_ + b].reserve(t, n);
    return std::max(d2h_[a].reserve(t, n), h2d_[b].reserve(t, n));
  }

  int issue(Path &p, Chunk &c) override {
    std::lock_guard<std::mutex> lk(m_);
    double t = now();
    int g = p.gpu, v = p.via;
    if (v == g) {
      c.be.sim.done_t = (p.dir == GE_H2D ? h2d_[g] : d2h_[g]).reserve(t, c.len) + lat_[g];
    } else if (p.dir == GE_H2D) {
      double e1 = h2d_[v].reserve(t, c.len) + lat_[v];
      c.be.sim.done_t = peer_stage(v, g, e1, c.len) + 1e-6;
    } else {
      double e1 = peer_stage(g, v, t, c.len) + 1e-6;
      c.be.sim.done_t = d2h_[v].reserve(e1, c.len) + lat_[v];
    }
    return GE_OK;
  }

  int complete(Path &p, Chunk &c) override {
    if (fail_[size_t(p.id)]) return GE_EPATH;  // injected fault: nothing written, the chunk is retried elsewhere
    void *dev = reinterpret_cast<void *>(c.dev);
    void *host = reinterpret_cast<void *>(c.host);
    void *relay = reinterpret_cast<void *>(c.relay);
    if (p.dir == GE_H2D) {
      if (c.relay) {
        std::memcpy(relay, host, c.len);
        std::memcpy(dev, relay, c.len);
      } else {
        std::memcpy(dev, host, c.len);
      }
    } else {
      if (c.relay) {
        std::memcpy(relay, dev, c.len);
        std::memcpy(host, relay, c.len);
      } else {
        std::memcpy(host, dev, c.len);
      }
    }
    auto when = t0_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(c.be.sim.done_t * scale_));
    std::this_thread::sleep_until(when);
    return GE_OK;
  }

  int alloc(uint64_t n, int kind, int gpu, uint64_t *ptr) {
    void *p = nullptr;
    if (posix_memalign(&p, 4096, n)) return GE_ENOMEM;
    std::lock_guard<std::mutex> lk(m_);
    allocs_[uint64_t(p)] = {n, kind, gpu, true};
    *ptr = uint64_t(p);
    return GE_OK;
  }

  int release(uint64_t ptr, int kind) {
    std::lock_guard<std::mutex> lk(m_);
    auto it = allocs_.find(ptr);
    if (it == allocs_.end() || it->second.kind != kind || !it->second.owned) return GE_EFREED;
    free(reinterpret_cast<void *>(ptr));
    allocs_.erase(it);
    return GE_OK;
  }

  int alloc_device(int gpu, uint64_t n, uint64_t *ptr) override { return alloc(n, GE_MEM_DEVICE, gpu, ptr); }
  int free_device(uint64_t ptr) override { return release(ptr, GE_MEM_DEVICE); }
  int alloc_host(uint64_t n, uint64_t *ptr) override { return alloc(n, GE_MEM_PINNED, -1, ptr); }
  int free_host(uint64_t ptr) override { return release(ptr, GE_MEM_PINNED); }

  int classify(uint64_t ptr, int *kind, int *gpu, uint64_t *avail) override {
    std::lock_guard<std::mutex> lk(m_);
    auto it = allocs_.upper_bound(ptr);
    if (it != allocs_.begin()) {
      --it;
      if (ptr < it->first + it->second.size) {
        *kind = it->second.kind;
        *gpu = it->second.gpu;
        *avail = it->first + it->second.size - ptr;
        return GE_OK;
      }
    }
    *kind = GE_MEM_PAGEABLE;
    *gpu = -1;
    *avail = 0;
    return GE_OK;
  }

  int host_register(uint64_t ptr, uint64_t n) override {
    std::lock_guard<std::mutex> lk(m_);
    auto it = allocs_.upper_bound(ptr + n - 1);
    if (it != allocs_.begin()) {
      --it;
      if (it->first + it->second.size > ptr) return GE_EBUSY;  // overlaps a registration or allocation
    }
    allocs_[ptr] = {n, GE_MEM_PINNED, -1, false};
    return GE_OK;
  }

  int host_unregister(uint64_t ptr) override {
    std::lock_guard<std::mutex> lk(m_);
    auto it = allocs_.find(ptr);
    if (it == allocs_.end() || it->second.owned) return GE_EFREED;
    allocs_.erase(it);
    return GE_OK;
  }

  void link_gbps(int gpu, double *h2d, double *d2h) override {
    std::lock_guard<std::mutex> lk(m_);
    *h2d = h2d_[gpu].gbps;
    *d2h = d2h_[gpu].gbps;
  }

  // ---- SimControls ----
  int track(uint64_t ptr, uint64_t n, int kind, int gpu) override {
    std::lock_guard<std::mutex> lk(m_);
    auto it = allocs_.upper_bound(ptr + n - 1);
    if (it != allocs_.begin() && std::prev(it)->first + std::prev(it)->second.size > ptr) return GE_EBUSY;
    allocs_[ptr] = {n, kind, gpu, false};
    return GE_OK;
  }

  int untrack(uint64_t ptr, int kind) override {
    std::lock_guard<std::mutex> lk(m_);
    auto it = allocs_.find(ptr);
    if (it == allocs_.end() || it->second.owned || it->second.kind != kind) return GE_EFREED;
    allocs_.erase(it);
    return GE_OK;
  }

  int set_link(int gpu, double gbps) override {
    std::lock_guard<std::mutex> lk(m_);
    h2d_[gpu].gbps = gbps;
    d2h_[gpu].gbps = gbps;
    return GE_OK;
  }

  void fail_path(int id, bool fail) override { fail_[size_t(id)] = fail; }

  ~SimBackend() override {
    for (auto &kv : allocs_)
      if (kv.second.owned) free(reinterpret_cast<void *>(kv.first));
  }

 private:
  int n_;
  double scale_, nvlink_;
  std::vector<double> lat_, peer_;
  std::vector<Resource> h2d_, d2h_, pair_;
  std::map<uint64_t, Alloc> allocs_;
  std::deque<std::atomic<bool>> fail_;  // by path id (ge_sim_fail_path); sized before any copy, then fixed
  std::mutex m_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

Backend *make_sim_backend(int n, const double *link_gbps, const double *latency_us, const double *peer_gbps,
                          double nvlink_gbps, double time_scale) {
  return new SimBackend(n, link_gbps, latency_us, peer_gbps, nvlink_gbps, time_scale);
}

SimControls *sim_controls(Backend &b) { return dynamic_cast<SimBackend *>(&b); }

}  // namespace ge
