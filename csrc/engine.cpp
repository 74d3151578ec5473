// The C ABI (gpudash_engine.h) around the scheduler in scheduler.hpp.
#include <algorithm>
#include <cstring>

#include "backend_sim.hpp"
#include "scheduler.hpp"

using ge::Engine;

struct ge_engine {
  Engine eng;
};

namespace {
constexpr int kMaxSimGpus = 32;  // the largest rig ge_create_sim models
}  // namespace

extern "C" {

int ge_abi_version(void) { return GE_ABI_VERSION; }

const char *ge_strerror(int code) {
  switch (code) {
    case GE_OK: return "GE_OK";
    case GE_EINVAL: return "GE_EINVAL";
    case GE_ENOMEM: return "GE_ENOMEM";
    case GE_ENODEV: return "GE_ENODEV";
    case GE_EFREED: return "GE_EFREED";
    case GE_ERANGE: return "GE_ERANGE";
    case GE_EPATH: return "GE_EPATH";
    case GE_ETIMEOUT: return "GE_ETIMEOUT";
    case GE_ENOTSUP: return "GE_ENOTSUP";
    case GE_ECLOSED: return "GE_ECLOSED";
    case GE_ENOCUDA: return "GE_ENOCUDA";
    case GE_EBUSY: return "GE_EBUSY";
    default: break;
  }
  if (code >= GE_CUDA_BASE) {
    const char *s = ge::cuda_error_name(code - GE_CUDA_BASE);
    return s ? s : "CUDA_ERROR_UNKNOWN";
  }
  return "GE_UNKNOWN";
}

static int create(ge::Backend *b, const ge_knobs *k, double scale, ge_engine **out) {
  if (!b || !k || !out) return GE_EINVAL;
  int rc = ge::validate_knobs(*k);
  if (rc) {
    delete b;
    return rc;
  }
  auto *e = new ge_engine;
  rc = e->eng.init(b, *k, scale);
  if (rc) {
    delete e;
    return rc;
  }
  *out = e;
  return GE_OK;
}

int ge_create_sim(int n, const double *link_gbps, const double *latency_us, const double *peer_gbps,
                  double nvlink_gbps, double time_scale, const ge_knobs *knobs, ge_engine **out) {
  if (n < 1 || n > kMaxSimGpus || !link_gbps || !latency_us || !peer_gbps || !(time_scale > 0)) return GE_EINVAL;
  for (int i = 0; i < n; ++i)
    if (!(link_gbps[i] > 0) || latency_us[i] < 0) return GE_EINVAL;
  return create(ge::make_sim_backend(n, link_gbps, latency_us, peer_gbps, nvlink_gbps, time_scale), knobs,
                time_scale, out);
}

int ge_create_cuda(const ge_knobs *knobs, ge_engine **out) { return create(ge::make_cuda_backend(), knobs, 1.0, out); }

void ge_destroy(ge_engine *e) { delete e; }

int ge_num_gpus(ge_engine *e) { return e->eng.num_gpus(); }

int ge_device_name(ge_engine *e, int gpu, char *buf, int cap) {
  if (gpu < 0 || gpu >= e->eng.num_gpus()) return GE_ENODEV;
  std::string s = e->eng.backend().device_name(gpu);
  if (cap > 0) {
    std::strncpy(buf, s.c_str(), size_t(cap - 1));
    buf[cap - 1] = 0;
  }
  return GE_OK;
}

int ge_peer_gbps(ge_engine *e, int a, int b, double *gbps) {
  if (a < 0 || b < 0 || a >= e->eng.num_gpus() || b >= e->eng.num_gpus()) return GE_ENODEV;
  *gbps = a == b ? 0.0 : e->eng.backend().peer_gbps(a, b);
  return GE_OK;
}

double ge_now(ge_engine *e) { return e->eng.backend().now(); }

int ge_set_knobs(ge_engine *e, const ge_knobs *k) {
  int rc = ge::validate_knobs(*k);
  return rc ? rc : e->eng.set_knobs(*k);
}

int ge_get_knobs(ge_engine *e, ge_knobs *k) {
  *k = e->eng.knobs();
  return GE_OK;
}

int ge_engine_pool(ge_engine *e, int which, gp_pool **pool, int *shard, uint64_t *base, uint64_t *size,
                   uint64_t *granule, uint64_t *floor) {
  if (which < -1 || which >= e->eng.num_gpus()) return GE_ENODEV;
  ge::PoolView P = e->eng.pool(which);
  *pool = P.pool;
  *shard = P.shard;
  *base = P.slab;
  *size = P.size;
  *granule = P.granule;
  *floor = P.floor;
  return GE_OK;
}

int ge_pool_need(ge_engine *e, const ge_knobs *k, int which, uint64_t *need) {
  if (which < -1 || which >= e->eng.num_gpus()) return GE_ENODEV;
  *need = e->eng.pool_need(*k, which);
  return GE_OK;
}

int ge_num_paths(ge_engine *e) { return e->eng.num_paths(); }

int ge_stats(ge_engine *e, ge_path_stats *out, int cap, ge_link_stats *links, int lcap) {
  Engine &eng = e->eng;
  int n = std::min(cap, eng.num_paths());
  for (int i = 0; i < n; ++i) eng.path_stats(i, &out[i]);
  int m = std::min(lcap, eng.num_gpus());
  for (int i = 0; i < m; ++i) eng.link_stats(i, &links[i]);
  return GE_OK;
}

// The sim backend's own controls (backend_sim.hpp); GE_ENOTSUP on another backend.
int ge_sim_set_link(ge_engine *e, int gpu, double gbps) {
  if (gpu < 0 || gpu >= e->eng.num_gpus()) return GE_ENODEV;
  if (!(gbps > 0)) return GE_EINVAL;
  ge::SimControls *sim = ge::sim_controls(e->eng.backend());
  return sim ? sim->set_link(gpu, gbps) : GE_ENOTSUP;
}

int ge_sim_fail_path(ge_engine *e, int gpu, int via, int direction, int fail) {
  if (gpu < 0 || gpu >= e->eng.num_gpus() || via < 0 || via >= e->eng.num_gpus()) return GE_ENODEV;
  ge::SimControls *sim = ge::sim_controls(e->eng.backend());
  if (!sim) return GE_ENOTSUP;
  int id = e->eng.path_id(gpu, via, direction);
  if (id < 0) return GE_EINVAL;
  sim->fail_path(id, fail != 0);
  if (!fail) e->eng.heal_path(id);
  return GE_OK;
}

int ge_sim_track(ge_engine *e, uint64_t ptr, uint64_t n, int kind, int gpu) {
  if (kind == GE_MEM_DEVICE && (gpu < 0 || gpu >= e->eng.num_gpus())) return GE_ENODEV;
  if (!ptr || !n || (kind != GE_MEM_DEVICE && kind != GE_MEM_PINNED)) return GE_EINVAL;
  ge::SimControls *sim = ge::sim_controls(e->eng.backend());
  return sim ? sim->track(ptr, n, kind, kind == GE_MEM_DEVICE ? gpu : -1) : GE_ENOTSUP;
}
int ge_sim_untrack(ge_engine *e, uint64_t ptr, int kind) {
  ge::SimControls *sim = ge::sim_controls(e->eng.backend());
  return sim ? sim->untrack(ptr, kind) : GE_ENOTSUP;
}

int ge_alloc_device(ge_engine *e, int gpu, uint64_t n, uint64_t *ptr) {
  if (gpu < 0 || gpu >= e->eng.num_gpus()) return GE_ENODEV;
  if (n == 0) return GE_EINVAL;
  return e->eng.backend().alloc_device(gpu, n, ptr);
}
int ge_free_device(ge_engine *e, uint64_t ptr) { return e->eng.backend().free_device(ptr); }
int ge_alloc_host(ge_engine *e, uint64_t n, uint64_t *ptr) {
  if (n == 0) return GE_EINVAL;
  return e->eng.backend().alloc_host(n, ptr);
}
int ge_free_host(ge_engine *e, uint64_t ptr) { return e->eng.backend().free_host(ptr); }
int ge_classify(ge_engine *e, uint64_t ptr, int *kind, int *gpu, uint64_t *avail) {
  return e->eng.backend().classify(ptr, kind, gpu, avail);
}
int ge_kind(ge_engine *e, uint64_t ptr) {
  int kind = 0, gpu = -1;
  uint64_t avail = 0;
  int rc = e->eng.backend().classify(ptr, &kind, &gpu, &avail);
  return rc ? rc : kind * 256 + (gpu + 1);
}
int ge_host_register(ge_engine *e, uint64_t ptr, uint64_t n) { return e->eng.backend().host_register(ptr, n); }
int ge_host_unregister(ge_engine *e, uint64_t ptr) { return e->eng.backend().host_unregister(ptr); }

int ge_copy(ge_engine *e, const ge_copy_desc *d, int host_mode, uint64_t stream, uint64_t *handle) {
  std::shared_ptr<ge::Copy> c;
  int rc = e->eng.start_copy(d->direction, d->gpu, d->dst, d->src, d->nbytes, host_mode, stream, &c);
  if (rc == GE_OK) *handle = e->eng.add_handle(c);
  return rc;
}

int ge_copy_sync(ge_engine *e, const ge_copy_desc *d, int host_mode, uint64_t stream, uint64_t out[2]) {
  Engine::BlockingCall in(e->eng);
  int paths_used = 0;
  int rc = e->eng.copy_sync(d->direction, d->gpu, d->dst, d->src, d->nbytes, host_mode, stream, &out[0], &paths_used);
  out[1] = uint64_t(paths_used);
  return rc;
}

int ge_wait(ge_engine *e, uint64_t handle, double timeout_s) {
  Engine::BlockingCall in(e->eng);
  auto c = e->eng.find(handle);
  return c ? e->eng.wait(*c, timeout_s) : GE_EINVAL;
}

int ge_copy_chunks(ge_engine *e, uint64_t handle, uint64_t *chunks, int *paths_used) {
  auto c = e->eng.find(handle);
  if (!c) return GE_EINVAL;
  e->eng.progress(*c, chunks, paths_used);
  return GE_OK;
}

int ge_finish(ge_engine *e, uint64_t handle, double timeout_s, uint64_t *chunks, int *paths_used) {
  Engine::BlockingCall in(e->eng);
  auto c = e->eng.find(handle);
  if (!c) return GE_EINVAL;
  int rc = e->eng.wait(*c, timeout_s);
  if (rc == GE_ETIMEOUT) return rc;
  e->eng.progress(*c, chunks, paths_used);
  ge_release(e, handle);
  return rc;
}

int ge_release(ge_engine *e, uint64_t handle) { return e->eng.release(handle); }

}  // extern "C"
