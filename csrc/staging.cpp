// The staging threads (staging.hpp).
#include "staging.hpp"

#include <sys/prctl.h>

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

void StagingThreads::loop() {
  prctl(PR_SET_NAME, "ge-staging", 0, 0, 0);  // tells them apart in top -H and in profiles
  std::unique_lock<std::mutex> lk(m_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !tasks_.empty() || alive_ > target_; });
    if (alive_ > target_) {
      --alive_;
      return;
    }
    if (tasks_.empty()) return;  // stop_, and nothing left to run
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lk.unlock();
    task();
    lk.lock();
  }
}

void StagingThreads::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(m_);
    if (!stop_) {
      tasks_.push_back(std::move(task));
      cv_.notify_one();
      return;
    }
  }
  task();
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
