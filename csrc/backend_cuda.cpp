// CUDA backend through the driver API, loaded at run time (dlopen libcuda.so.1 + cuGetProcAddress), so
// the build needs no toolkit and the engine shares each device's primary context with CuPy / PyTorch.
// Every path owns one non-blocking stream on the GPU whose host link it uses; a chunk is one or two
// async copies plus an event that the path's worker (or a synchronous caller) polls.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "engine_core.hpp"

namespace ge {
namespace {

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;

struct Api {
  bool loaded = false;
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetName)(char *, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext *);
  CUresult (*cuDeviceCanAccessPeer)(int *, CUdevice, CUdevice);
  CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned);
  CUresult (*cuStreamCreate)(CUstream *, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
  CUresult (*cuEventCreate)(CUevent *, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
  CUresult (*cuMemFreeHost)(void *);
  CUresult (*cuMemHostRegister)(void *, size_t, unsigned);
  CUresult (*cuMemHostUnregister)(void *);
  CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
  CUresult (*cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
  CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, uint32_t, unsigned);
  CUresult (*cuGetErrorName)(CUresult, const char **);
};

Api api;
std::mutex api_m;

int load_api() {
  std::lock_guard<std::mutex> lk(api_m);
  if (api.loaded) return GE_OK;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return GE_ENOCUDA;
  typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);
  auto gpa = reinterpret_cast<gpa_t>(dlsym(h, "cuGetProcAddress_v2"));
  bool ok = true;
  auto get = [&](const char *name, const char *fallback, auto &fn) {
    void *p = nullptr;
    int status = 0;
    if (gpa && gpa(name, &p, 12000, 0, &status) != 0) p = nullptr;
    if (!p) p = dlsym(h, fallback);
    if (!p) ok = false;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  get("cuInit", "cuInit", api.cuInit);
  get("cuDeviceGetCount", "cuDeviceGetCount", api.cuDeviceGetCount);
  get("cuDeviceGet", "cuDeviceGet", api.cuDeviceGet);
  get("cuDeviceGetName", "cuDeviceGetName", api.cuDeviceGetName);
  get("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain);
  get("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", api.cuDevicePrimaryCtxRelease);
  get("cuCtxSetCurrent", "cuCtxSetCurrent", api.cuCtxSetCurrent);
  get("cuCtxPushCurrent", "cuCtxPushCurrent_v2", api.cuCtxPushCurrent);
  get("cuCtxPopCurrent", "cuCtxPopCurrent_v2", api.cuCtxPopCurrent);
  get("cuDeviceCanAccessPeer", "cuDeviceCanAccessPeer", api.cuDeviceCanAccessPeer);
  get("cuCtxEnablePeerAccess", "cuCtxEnablePeerAccess", api.cuCtxEnablePeerAccess);
  get("cuStreamCreate", "cuStreamCreate", api.cuStreamCreate);
  get("cuStreamDestroy", "cuStreamDestroy_v2", api.cuStreamDestroy);
  get("cuStreamGetCtx", "cuStreamGetCtx", api.cuStreamGetCtx);
  get("cuEventCreate", "cuEventCreate", api.cuEventCreate);
  get("cuEventDestroy", "cuEventDestroy_v2", api.cuEventDestroy);
  get("cuEventRecord", "cuEventRecord", api.cuEventRecord);
  get("cuEventSynchronize", "cuEventSynchronize", api.cuEventSynchronize);
  get("cuEventQuery", "cuEventQuery", api.cuEventQuery);
  get("cuStreamSynchronize", "cuStreamSynchronize", api.cuStreamSynchronize);
  get("cuStreamQuery", "cuStreamQuery", api.cuStreamQuery);
  get("cuCtxGetCurrent", "cuCtxGetCurrent", api.cuCtxGetCurrent);
  get("cuStreamWaitEvent", "cuStreamWaitEvent", api.cuStreamWaitEvent);
  get("cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", api.cuMemcpyHtoDAsync);
  get("cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", api.cuMemcpyDtoHAsync);
  get("cuMemcpyPeerAsync", "cuMemcpyPeerAsync", api.cuMemcpyPeerAsync);
  get("cuMemAlloc", "cuMemAlloc_v2", api.cuMemAlloc);
  get("cuMemFree", "cuMemFree_v2", api.cuMemFree);
  get("cuMemHostAlloc", "cuMemHostAlloc", api.cuMemHostAlloc);
  get("cuMemFreeHost", "cuMemFreeHost", api.cuMemFreeHost);
  get("cuMemHostRegister", "cuMemHostRegister_v2", api.cuMemHostRegister);
  get("cuMemHostUnregister", "cuMemHostUnregister", api.cuMemHostUnregister);
  get("cuPointerGetAttribute", "cuPointerGetAttribute", api.cuPointerGetAttribute);
  get("cuMemGetAddressRange", "cuMemGetAddressRange_v2", api.cuMemGetAddressRange);
  get("cuStreamWaitValue32", "cuStreamWaitValue32_v2", api.cuStreamWaitValue32);
  get("cuGetErrorName", "cuGetErrorName", api.cuGetErrorName);
  if (!ok) return GE_ENOCUDA;
  if (api.cuInit(0) != 0) return GE_ENOCUDA;
  api.loaded = true;
  return GE_OK;
}

inline int cu(CUresult r) { return r == 0 ? GE_OK : GE_CUDA_BASE + r; }

constexpr unsigned kEventFlags = 0x1 | 0x2;  // CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING
constexpr uint32_t kFlagSlots = 1u << 16;

// Pushes a context for the scope of a call made from a caller's thread.
struct CtxScope {
  explicit CtxScope(CUcontext c) { api.cuCtxPushCurrent(c); }
  ~CtxScope() {
    CUcontext x;
    api.cuCtxPopCurrent(&x);
  }
};

// Makes `c` current and restores the previous context at scope end (only when they differ).
struct CtxSwitch {
  CUcontext prev = nullptr;
  bool switched = false;
  explicit CtxSwitch(CUcontext c) {
    api.cuCtxGetCurrent(&prev);
    if (prev != c) switched = api.cuCtxSetCurrent(c) == 0;
  }
  ~CtxSwitch() {
    if (switched) api.cuCtxSetCurrent(prev);
  }
};

// A copy's place in its caller's stream (stream_begin / stream_end): the copy's chunks start after the
// work the caller queued before it, and the caller's later work waits for the copy's flag.
struct StreamOrder final : CopyState {
  void *start_event = nullptr;     // recorded on the user stream at copy time
  uint32_t flag_slot = 0, flag_value = 0;
  bool stream_flag = false;        // later work on the user stream waits for flag_value in flag_slot
  std::vector<char> path_waited;   // by path id: that path's stream already waits on start_event
};

class CudaBackend : public Backend {
 public:
  int init(Engine &) override {
    int rc = load_api();
    if (rc) return rc;
    int n = 0;
    if ((rc = cu(api.cuDeviceGetCount(&n)))) return rc;
    if (n < 1) return GE_ENODEV;
    for (int i = 0; i < n; ++i) {
      CUdevice d;
      CUcontext c;
      if ((rc = cu(api.cuDeviceGet(&d, i)))) return rc;
      if ((rc = cu(api.cuDevicePrimaryCtxRetain(&c, d)))) return rc;
      devs_.push_back(d);
      ctx_.push_back(c);
    }
    events_.resize(n);
    peer_.assign(size_t(n) * n, 0);
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        int can = 0;
        api.cuDeviceCanAccessPeer(&can, devs_[a], devs_[b]);
        if (!can) continue;
        CtxScope s(ctx_[a]);
        CUresult r = api.cuCtxEnablePeerAccess(ctx_[b], 0);
        if (r == 0 || r == 704 /* PEER_ACCESS_ALREADY_ENABLED */) peer_[size_t(a) * n + b] = -1.0;
      }
    CtxScope s(ctx_[0]);
    void *flags = nullptr;
    if ((rc = cu(api.cuMemHostAlloc(&flags, kFlagSlots * 4, 0x1 | 0x2 /* PORTABLE | DEVICEMAP */)))) return rc;
    std::memset(flags, 0, kFlagSlots * 4);
    flags_ = static_cast<uint32_t *>(flags);
    return GE_OK;
  }

  ~CudaBackend() override {
    if (!api.loaded) return;
    for (size_t d = 0; d < events_.size(); ++d)
      for (CUevent ev : events_[d]) api.cuEventDestroy(ev);
    if (flags_) api.cuMemFreeHost(flags_);
    for (CUdevice d : devs_) api.cuDevicePrimaryCtxRelease(d);
  }

  int num_gpus() const override { return int(devs_.size()); }
  std::string device_name(int gpu) override {
    char buf[256] = {0};
    api.cuDeviceGetName(buf, sizeof buf, devs_[gpu]);
    return buf;
  }
  double peer_gbps(int a, int b) override { return peer_[size_t(a) * devs_.size() + b]; }
  double now() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void thread_init(int gpu) override { api.cuCtxSetCurrent(ctx_[gpu]); }

  int prepare_path(Path &p) override {
    CtxScope s(ctx_[p.via]);
    CUstream st = nullptr;
    int rc = cu(api.cuStreamCreate(&st, 0x1 /* NON_BLOCKING */));
    paths_.emplace_back();  // ids arrive in order: path p.id is paths_[p.id]
    paths_.back().stream = st;
    return rc;
  }
  void release_path(Path &p) override {  // also a path never prepared (init failed before it)
    if (size_t(p.id) < paths_.size() && state(p).stream) api.cuStreamDestroy(state(p).stream);
  }

  int get_event(int dev, CUevent *ev) {
    {
      std::lock_guard<std::mutex> lk(ev_m_);
      if (!events_[dev].empty()) {
        *ev = events_[dev].back();
        events_[dev].pop_back();
        return GE_OK;
      }
    }
    CtxScope s(ctx_[dev]);
    return cu(api.cuEventCreate(ev, kEventFlags));
  }

  int issue(Path &p, Chunk &c) override {
    CtxSwitch sw(ctx_[p.via]);  // issue may run in the caller's thread: leave its context as it was
    CUstream st = state(p).stream;
    StreamOrder *order = static_cast<StreamOrder *>(c.copy->medium.get());
    int rc = GE_OK;
    if (order && order->start_event && !order->path_waited[p.id]) {
      if ((rc = cu(api.cuStreamWaitEvent(st, order->start_event, 0)))) return rc;
      order->path_waited[p.id] = 1;
    }
    const void *host = reinterpret_cast<const void *>(c.host);
    if (p.dir == GE_H2D) {
      if (p.via == p.gpu) {
        rc = cu(api.cuMemcpyHtoDAsync(c.dev, host, c.len, st));
      } else {
        rc = cu(api.cuMemcpyHtoDAsync(c.relay, host, c.len, st));
        if (!rc) rc = cu(api.cuMemcpyPeerAsync(c.dev, ctx_[p.gpu], c.relay, ctx_[p.via], c.len, st));
      }
    } else {
      void *h = reinterpret_cast<void *>(c.host);
      if (p.via == p.gpu) {
        rc = cu(api.cuMemcpyDtoHAsync(h, c.dev, c.len, st));
      } else {
        rc = cu(api.cuMemcpyPeerAsync(c.relay, ctx_[p.via], c.dev, ctx_[p.gpu], c.len, st));
        if (!rc) rc = cu(api.cuMemcpyDtoHAsync(h, c.relay, c.len, st));
      }
    }
    if (rc) return rc;
    CUevent ev = nullptr;
    if ((rc = get_event(p.via, &ev))) return rc;
    c.be.cuda.event = ev;
    return cu(api.cuEventRecord(ev, st));
  }

  // One async copy and a stream sync, as a native caller would do it: on the caller's stream (in its
  // context) when there is one, else on the path's stream, which has nothing in flight (copy_now).
  // Long copies are waited for like chunks (await: napping through most of the copy), not spun on.
  int copy_now(Path &p, Chunk &c, uint64_t stream) override {
    CUstream st = state(p).stream;
    CUcontext sc = ctx_[p.via];
    if (stream) {
      st = reinterpret_cast<CUstream>(stream);
      if (int rc = cu(api.cuStreamGetCtx(st, &sc))) return rc;
    }
    CtxSwitch sw(sc);
    CUresult r = p.dir == GE_H2D ? api.cuMemcpyHtoDAsync(c.dev, reinterpret_cast<const void *>(c.host), c.len, st)
                                 : api.cuMemcpyDtoHAsync(reinterpret_cast<void *>(c.host), c.dev, c.len, st);
    if (r) return cu(r);
    if (c.len < kSpinBytes) return cu(api.cuStreamSynchronize(st));  // short: spin in the driver, as native does
    return await(p, c.len, c.issue_t, [&] { return api.cuStreamQuery(st); }, [&] { return api.cuStreamSynchronize(st); });
  }

  // Waits until query() stops answering NOT_READY for a copy of `len` bytes issued at `issue_t`: sleep
  // through the first half of its predicted time (from the best rate this path has shown; a nap under
  // 50 us is not worth its late wake-up), then spin
  // (yielding) through the rest of the predicted time and 400 us more, then naps growing with the wait;
  // after 50 ms block(). On a VM a timer wake-up lands tens of microseconds late, so only the first half
  // of a copy, where that costs nothing, is slept through (the driver's blocking sync, and naps near
  // the end, both cost several percent). Copies of 8 MiB and more teach the path its best rate.
  template <class Query, class Block>
  int await(Path &p, uint64_t len, double issue_t, Query query, Block block) {
    double best = state(p).rate_max.load();
    double spin = 400e-6;
    if (best > 0) {
      double predicted = double(len) / best;
      double nap = issue_t + 0.5 * predicted - now();
      if (nap > 50e-6) std::this_thread::sleep_for(std::chrono::duration<double>(nap));  // shorter: no gain
      spin += std::max(0.0, issue_t + predicted - now());
    }
    CUresult q = 0;
    if (!poll_until([&] { return (q = query()) != 600 /* NOT_READY */; }, spin, 128.0, 50e-6, 0.05)) q = block();
    int rc = cu(q);
    double took = now() - issue_t;  // includes queueing behind earlier work: only ever too low
    if (rc == GE_OK && len >= kSpinBytes && took > 0) {
      double r = double(len) / took;
      if (r > best) state(p).rate_max.store(r);
    }
    return rc;
  }

  int complete(Path &p, Chunk &c) override {
    int rc = await(p, c.len, c.issue_t, [&] { return api.cuEventQuery(c.be.cuda.event); },
                   [&] { return api.cuEventSynchronize(c.be.cuda.event); });
    std::lock_guard<std::mutex> lk(ev_m_);
    events_[p.via].push_back(c.be.cuda.event);
    c.be.cuda.event = nullptr;
    return rc;
  }

  int alloc_device(int gpu, uint64_t n, uint64_t *ptr) override {
    CtxScope s(ctx_[gpu]);
    CUdeviceptr d = 0;
    int rc = cu(api.cuMemAlloc(&d, n));
    if (rc == GE_CUDA_BASE + 2 /* OUT_OF_MEMORY */) return GE_ENOMEM;
    *ptr = d;
    return rc;
  }
  int free_device(uint64_t ptr) override {
    CtxScope s(ctx_[0]);
    return cu(api.cuMemFree(ptr));
  }
  int alloc_host(uint64_t n, uint64_t *ptr) override {
    CtxScope s(ctx_[0]);
    void *p = nullptr;
    int rc = cu(api.cuMemHostAlloc(&p, n, 0x1 /* PORTABLE */));
    if (rc == GE_CUDA_BASE + 2) return GE_ENOMEM;
    *ptr = uint64_t(p);
    return rc;
  }
  int free_host(uint64_t ptr) override {
    CtxScope s(ctx_[0]);
    return cu(api.cuMemFreeHost(reinterpret_cast<void *>(ptr)));
  }

  int classify(uint64_t ptr, int *kind, int *gpu, uint64_t *avail) override {
    CtxScope s(ctx_[0]);
    unsigned memtype = 0;
    *gpu = -1;
    *avail = 0;
    if (api.cuPointerGetAttribute(&memtype, 2 /* MEMORY_TYPE */, ptr) != 0) {
      *kind = GE_MEM_PAGEABLE;
      return GE_OK;
    }
    CUdeviceptr start = 0;
    size_t size = 0;
    if (memtype == 2 /* DEVICE */) {
      int ord = -1;
      api.cuPointerGetAttribute(&ord, 9 /* DEVICE_ORDINAL */, ptr);
      *kind = GE_MEM_DEVICE;
      *gpu = ord;
      if (api.cuMemGetAddressRange(&start, &size, ptr) == 0) *avail = start + size - ptr;
      return GE_OK;
    }
    *kind = GE_MEM_PINNED;
    if (api.cuPointerGetAttribute(&start, 11 /* RANGE_START_ADDR */, ptr) == 0 &&
        api.cuPointerGetAttribute(&size, 12 /* RANGE_SIZE */, ptr) == 0 && size)
      *avail = start + size - ptr;
    return GE_OK;
  }

  int host_register(uint64_t ptr, uint64_t n) override {
    CtxScope s(ctx_[0]);
    return cu(api.cuMemHostRegister(reinterpret_cast<void *>(ptr), n, 0x1 /* PORTABLE */));
  }
  int host_unregister(uint64_t ptr) override {
    CtxScope s(ctx_[0]);
    return cu(api.cuMemHostUnregister(reinterpret_cast<void *>(ptr)));
  }

  // Work already on the user stream runs before the copy (start event); later work on it waits on a
  // host-mapped flag the engine sets when the copy has landed (or failed).
  int stream_begin(Copy &c) override {
    if (!c.stream) return GE_OK;
    CUstream us = reinterpret_cast<CUstream>(c.stream);
    CUcontext sc = nullptr;
    int rc = cu(api.cuStreamGetCtx(us, &sc));
    if (rc) return rc;
    CtxScope s(sc);
    CUevent ev = nullptr;
    if ((rc = cu(api.cuEventCreate(&ev, 0x2)))) return rc;
    if ((rc = cu(api.cuEventRecord(ev, us)))) {
      api.cuEventDestroy(ev);
      return rc;
    }
    auto order = std::make_unique<StreamOrder>();
    uint32_t seq = ++seq_;
    order->flag_slot = seq % kFlagSlots;
    order->flag_value = seq;
    CUdeviceptr flag = CUdeviceptr(reinterpret_cast<uintptr_t>(flags_ + order->flag_slot));
    if ((rc = cu(api.cuStreamWaitValue32(us, flag, seq, 0x0 /* GEQ */)))) {
      api.cuEventDestroy(ev);
      return rc;
    }
    order->start_event = ev;
    order->stream_flag = true;
    order->path_waited.assign(paths_.size(), 0);
    c.medium = std::move(order);
    return GE_OK;
  }

  void stream_end(Copy &c) override {
    StreamOrder *order = static_cast<StreamOrder *>(c.medium.get());
    if (!order || !order->stream_flag) return;
    __atomic_store_n(&flags_[order->flag_slot], order->flag_value, __ATOMIC_SEQ_CST);
    api.cuEventDestroy(order->start_event);
    order->start_event = nullptr;
    order->stream_flag = false;
  }

 private:
  std::vector<CUdevice> devs_;
  std::vector<CUcontext> ctx_;
  std::vector<double> peer_;
  std::vector<std::vector<CUevent>> events_;
  std::mutex ev_m_;
  uint32_t *flags_ = nullptr;
  std::atomic<uint32_t> seq_{0};
  // What the CUDA data plane keeps per path, by path id: sized by prepare_path before any copy, then fixed.
  struct PathState {
    CUstream stream = nullptr;          // the path's own stream
    std::atomic<double> rate_max{0};    // best bytes/s seen on a large chunk (to sleep through most of a copy)
  };
  std::deque<PathState> paths_;
  PathState &state(const Path &p) { return paths_[size_t(p.id)]; }
};

}  // namespace

Backend *make_cuda_backend() { return new CudaBackend(); }

const char *cuda_error_name(int r) {
  const char *s = nullptr;
  if (api.loaded && api.cuGetErrorName(r, &s) == 0) return s;
  return nullptr;
}

}  // namespace ge
