// The sim backend's own controls, which the CUDA backend has no counterpart for: the links' rates, user
// memory it is told about, and injected path faults (ge_sim_set_link, ge_sim_track / ge_sim_untrack,
// ge_sim_fail_path in engine.cpp). They are not part of Backend (engine_core.hpp), whose interface both
// backends implement; the C ABI reaches them through sim_controls().
#pragma once

#include "engine_core.hpp"

namespace ge {

class SimControls {
 public:
  // Host-link rate of `gpu` in both directions, from the next chunk on (GB/s, > 0).
  virtual int set_link(int gpu, double gbps) = 0;
  // Memory the sim did not allocate, classified as `kind` (GE_MEM_DEVICE of `gpu`, or GE_MEM_PINNED)
  // until untrack(); GE_EBUSY when it overlaps memory already known.
  virtual int track(uint64_t ptr, uint64_t n, int kind, int gpu) = 0;
  virtual int untrack(uint64_t ptr, int kind) = 0;
  // Path `id`'s chunks fail from now on (fail), or copy again; the scheduler heals its own flag.
  virtual void fail_path(int id, bool fail) = 0;

 protected:
  ~SimControls() = default;
};

Backend *make_sim_backend(int n, const double *link_gbps, const double *latency_us, const double *peer_gbps,
                          double nvlink_gbps, double time_scale);

// The sim controls of `b`; nullptr for a backend other than the sim's.
SimControls *sim_controls(Backend &b);

}  // namespace ge
