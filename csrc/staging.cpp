// The staging threads (staging.hpp).
#include "staging.hpp"

#include <sys/prctl.h>

#include <atomic>
#include <cstring>
#include <memory>

#include "engine_core.hpp"
#include "host_copy.hpp"

namespace ge {

void StagingThreads::resize(int n) {
  std::lock_guard<std::mutex> lk(m_);
  if (stop_) return;
  target_ = n;
  while (alive_ < target_) {
    ++alive_;
    threads_.emplace_back([this] { loop(); });
  }
  cv_.notify_all();
}

bool StagingThreads::claim() {
  size_t q = queued_.load(std::memory_order_acquire);
  while (q)
    if (queued_.compare_exchange_weak(q, q - 1, std::memory_order_acq_rel)) return true;
  return false;
}

void StagingThreads::loop() {
  prctl(PR_SET_NAME, "ge-staging", 0, 0, 0);  // tells them apart in top -H and in profiles
  for (;;) {
    bool got = claim() || poll_until([&] { return claim(); }, kIdleSpinS, 1.0, 0.0, kIdleSpinS);
    std::unique_lock<std::mutex> lk(m_);
    if (!got) cv_.wait(lk, [&] { return (got = claim()) || stop_ || alive_ > target_; });
    if (alive_ > target_) {  // resized down: leave, handing a claimed task to another thread
      --alive_;
      if (got) {
        queued_.fetch_add(1, std::memory_order_release);
        cv_.notify_one();
      }
      return;
    }
    if (!got) return;  // stop_, and nothing left to run
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lk.unlock();
    task();
  }
}

namespace {

thread_local uint64_t t_pieces_ns = 0;  // see pieces_cpu_ns()

// What the pieces of one split copy share: pieces still running, their CPU time, the callback.
struct Split {
  std::atomic<int> left{0};
  std::atomic<uint64_t> cpu_ns{0};
  std::function<void(uint64_t)> done;
};

}  // namespace

void StagingThreads::copy(uint64_t dst, uint64_t src, uint64_t len, CopyMode mode,
                          std::function<void(uint64_t)> done) {
  bool streaming = mode == CopyMode::kPiecesStreaming;
  uint64_t pieces = streaming ? std::max<uint64_t>(1, len / kPieceBytes) : 1;
  if (pieces > 1) {
    std::lock_guard<std::mutex> lk(m_);
    pieces = std::min<uint64_t>(pieces, uint64_t(std::max(1, target_)));
  }
  uint64_t step = (len / pieces + 4095) & ~uint64_t(4095);  // pieces of whole pages
  auto split = std::make_shared<Split>();
  split->done = std::move(done);
  std::vector<std::function<void()>> tasks;
  for (uint64_t off = 0; off < len || tasks.empty(); off += step) {
    uint64_t n = std::min(step, len - off);
    tasks.emplace_back([split, d = dst + off, s = src + off, n, streaming] {
      uint64_t t0 = thread_cpu_ns();
      if (streaming) copy_streaming(reinterpret_cast<void *>(d), reinterpret_cast<const void *>(s), n);
      else std::memcpy(reinterpret_cast<void *>(d), reinterpret_cast<const void *>(s), n);
      uint64_t cpu = thread_cpu_ns() - t0;
      t_pieces_ns += cpu;
      split->cpu_ns += cpu;
      if (split->left.fetch_sub(1) == 1) split->done(split->cpu_ns.load());  // every piece has added its time
    });
  }
  split->left = int(tasks.size());
  submit_all(tasks);
}

uint64_t StagingThreads::pieces_cpu_ns() { return t_pieces_ns; }

bool StagingThreads::run_one() {
  if (!claim()) return false;
  std::unique_lock<std::mutex> lk(m_);
  auto task = std::move(tasks_.front());  // a ticket is counted only once its task is queued
  tasks_.pop_front();
  lk.unlock();
  task();
  return true;
}

void StagingThreads::submit_all(std::vector<std::function<void()>> &tasks) {
  {
    std::lock_guard<std::mutex> lk(m_);
    if (!stop_) {
      for (auto &t : tasks) tasks_.push_back(std::move(t));
      queued_.fetch_add(tasks.size(), std::memory_order_release);
      if (tasks.size() == 1) cv_.notify_one();
      else cv_.notify_all();
      return;
    }
  }
  for (auto &t : tasks) t();
}

void StagingThreads::stop() {
  {
    std::lock_guard<std::mutex> lk(m_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  for (auto &t : threads_) t.join();
}

}  // namespace ge
